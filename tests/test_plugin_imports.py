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
