"""No import cycles in servelab, counting function-local imports (scripts/module_graph.py reads
the source; nothing is imported). A cycle that hides behind a function-local import still ties two
modules into one: move the piece both need to its own module instead."""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _module_graph():
    spec = importlib.util.spec_from_file_location("_servelab_module_graph", REPO / "scripts" / "module_graph.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_no_import_cycles_counting_function_local_imports():
    cycles = _module_graph().runtime_cycles(REPO / "framework")
    assert not cycles, "import cycles (python scripts/module_graph.py --no-edges lists the imports):\n" + "\n".join(
        " <-> ".join(cycle) for cycle in cycles)


def test_a_cycle_behind_a_function_local_import_is_found(tmp_path):
    """The check reads plugins/ and kernels/ too (mapped in pyproject.toml) and sees inside functions."""
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    skip = shutil.ignore_patterns("__pycache__", "checkpoints", "data", "*.pyc")
    for folder in ("framework", "plugins", "kernels", "conf"):
        shutil.copytree(REPO / folder, tmp_path / folder, ignore=skip)
    (tmp_path / "framework" / "core" / "loop_a.py").write_text("from servelab.plugins import loop_b\n")
    (tmp_path / "plugins" / "loop_b.py").write_text(
        "def late():\n    from servelab.core import loop_a  # noqa: PLC0415 - the hidden half of a cycle\n")
    cycles = _module_graph().runtime_cycles(tmp_path / "framework")
    assert ["servelab.core.loop_a", "servelab.plugins.loop_b"] in cycles
