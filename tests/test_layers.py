"""The import contracts in pyproject.toml ([tool.importlinter]) hold, and they do catch a breach.

Both run import-linter for real (scripts/lint_imports.py: the installed package layout as a tree
of links, then ``lint-imports``); the second on a copy of the package with an upward import added.
"""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest

pytest.importorskip("importlinter")

REPO = Path(__file__).resolve().parent.parent
CONTRACTS = {
    "layers": "servelab layers: each imports only those below it",
    "core": "servelab.core (the plugin contract) imports no torch, triton or Hydra",
    "engine": "servelab.engine imports no torch",
    "plugins": "built-in plugins import only the facades: plugin_api, testing (time models: time_model_api)",
}


def _lint_imports():
    spec = importlib.util.spec_from_file_location("_servelab_lint_imports", REPO / "scripts" / "lint_imports.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.lint_imports


def _flat(text: str) -> str:
    return " ".join(text.split())  # lint-imports wraps long contract names over lines


def _status(output: str, name: str) -> str:
    """KEPT / BROKEN for the contract named ``name`` in lint-imports' summary."""
    flat = _flat(output)
    at = flat.index(name) + len(name)
    for word in flat[at:].split():
        if word in ("KEPT", "BROKEN"):
            return word
    raise AssertionError(f"no status for {name!r} in:\n{output}")


def test_contracts_are_kept():
    done = _lint_imports()(REPO, [])
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    for name in CONTRACTS.values():
        assert _status(out, name) == "KEPT", out
    assert "0 broken" in out, out


def test_an_upward_import_breaks_the_contracts(tmp_path):
    """core importing servelab.run (and torch) is reported, as a broken layers contract and a
    broken torch-free core; the contracts it does not touch stay kept."""
    repo = tmp_path / "repo"
    repo.mkdir()
    shutil.copy(REPO / "pyproject.toml", repo / "pyproject.toml")
    skip = shutil.ignore_patterns("__pycache__", "checkpoints", "*.pyc")
    for folder in ("framework", "plugins", "kernels", "conf"):
        shutil.copytree(REPO / folder, repo / folder, ignore=skip)
    (repo / "framework" / "core" / "upward.py").write_text(
        '"""A deliberate breach: the plugin contract reaching up into the run layer, and torch."""\n'
        "import torch\n\n"
        "from servelab.run import session\n")

    done = _lint_imports()(repo, [])
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    assert _status(out, CONTRACTS["layers"]) == "BROKEN", out
    assert _status(out, CONTRACTS["core"]) == "BROKEN", out
    assert _status(out, CONTRACTS["engine"]) == "KEPT", out
    assert _status(out, CONTRACTS["plugins"]) == "KEPT", out
    flat = _flat(out)
    assert "servelab.core.upward -> servelab.run.session" in flat, out
    assert "servelab.core is not allowed to import torch" in flat, out
    assert "2 broken" in out, out


def test_a_builtin_plugin_importing_an_internal_module_breaks_the_plugin_contract(tmp_path):
    """A plugin module reaching past the facade into the engine (here for QueueScheduler, which
    servelab.plugin_api hands out) is reported; the other contracts stay kept."""
    repo = tmp_path / "repo"
    repo.mkdir()
    shutil.copy(REPO / "pyproject.toml", repo / "pyproject.toml")
    for folder in ("framework", "kernels", "conf"):  # read only: linked
        (repo / folder).symlink_to(REPO / folder)
    shutil.copytree(REPO / "plugins", repo / "plugins", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    (repo / "plugins" / "schedulers" / "reaching_in.py").write_text(
        '"""A deliberate breach: a scheduler importing an engine module, not servelab.plugin_api."""\n'
        "from servelab.engine.scheduling import QueueScheduler\n")

    done = _lint_imports()(repo, [])
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    assert _status(out, CONTRACTS["plugins"]) == "BROKEN", out
    for kept in ("layers", "core", "engine"):
        assert _status(out, CONTRACTS[kept]) == "KEPT", out
    flat = _flat(out)
    assert "servelab.plugins is not allowed to import servelab.engine" in flat, out
    assert "servelab.plugins.schedulers.reaching_in -> servelab.engine.scheduling" in flat, out
    assert "1 broken" in out, out
