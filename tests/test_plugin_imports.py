"""Importing a plugin module is light: no torch, no engine (a plugin package's own tests, and
`servelab --help`, import plugins without running a model)."""

import subprocess
import sys

from conftest import REPO


def test_builtin_plugin_modules_import_without_torch_or_the_engine():
    modules = sorted(f"servelab.plugins.{p.parent.name}.{p.stem}" for p in (REPO / "plugins").glob("*/*.py")
                     if p.stem != "__init__")
    code = ("import importlib, sys\n"
            f"for m in {modules!r}: importlib.import_module(m)\n"
            "print(sorted(m for m in ('torch', 'servelab.engine.engine', 'servelab.exec.executor') if m in sys.modules))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/", timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]", proc.stdout


def test_the_import_contract_forbids_every_servelab_module_but_the_facades():
    """``plugins-use-the-plugin-api`` lists what a plugin may not import; a new top-level module or
    sub-package of servelab must be listed there too (or be a facade), or plugins could reach it."""
    import pytest

    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    contracts = pyproject["tool"]["importlinter"]["contracts"]
    contract = next(c for c in contracts if c["id"] == "plugins-use-the-plugin-api")
    assert contract["source_modules"] == ["servelab.plugins"] and "ignore_imports" not in contract
    mapping = pyproject["tool"]["setuptools"]["package-dir"]
    top = {p.stem for p in (REPO / mapping["servelab"]).iterdir()
           if (p.suffix == ".py" and p.stem != "__init__") or (p / "__init__.py").is_file()}
    top |= {name.split(".")[1] for name in mapping if name.count(".") == 1}  # kernels, conf, plugins: not in framework/
    facades = {"plugin_api", "testing", "time_model_api", "plugins"}
    assert facades <= top
    assert {m.removeprefix("servelab.") for m in contract["forbidden_modules"]} == top - facades
