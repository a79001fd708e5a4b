"""The old flat import paths (servelab._moved): every one still listed imports, in a fresh
interpreter, as the very module of its new path (dotted ones too: no second copy), warns once naming
the new path, and names no module that exists on its own; the shims go in the release they name."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import servelab
from servelab._moved import MOVED, REMOVED_IN

REPO = Path(__file__).resolve().parent.parent


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split(".")[:3])


def test_the_shims_are_dropped_in_the_release_they_name():
    assert _version(servelab.__version__) < _version(REMOVED_IN), (
        f"servelab {servelab.__version__}: framework/_moved.py said its old paths go in {REMOVED_IN}")


def test_no_old_path_is_a_module_of_its_own():
    """A real module always wins over an alias (the finder steps aside), so such an entry is dead."""
    top = REPO / "framework"
    for old in MOVED:
        head, dot, _ = old.partition(".")  # servelab.model.llama is old because servelab.model is
        if dot and (top / head / "__init__.py").exists():  # servelab.run.stack: run/ stays, stack.py left it
            path = top / old.replace(".", "/")
            assert not path.with_suffix(".py").exists() and not (path / "__init__.py").exists(), old
            continue
        assert not (top / f"{head}.py").exists() and not (top / head / "__init__.py").exists(), old


def test_every_old_path_is_its_new_module_and_warns_once(tmp_path):
    script = textwrap.dedent('''
        import importlib, json, sys, warnings
        from servelab._moved import MOVED
        out = {}
        for old, new in MOVED.items():
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                try:
                    module = importlib.import_module("servelab." + old)
                except ImportError as exc:  # an optional extra this environment lacks
                    out[old] = ["skipped", str(exc)]
                    continue
            said = [str(w.message) for w in caught if issubclass(w.category, DeprecationWarning)
                    and str(w.message).startswith("servelab." + old + " moved")]
            out[old] = [module is sys.modules["servelab." + new], module.__name__, said]
        print(json.dumps(out))
    ''')
    proc = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    skipped = {old: why for old, (status, *why) in result.items() if status == "skipped"}
    assert len(skipped) <= 8, skipped  # only modules behind an optional extra (serve, triton) may be missing
    for old, new in MOVED.items():
        if old in skipped:
            continue
        same, name, said = result[old]
        assert same and name == f"servelab.{new}", (old, name)
        assert said == [f"servelab.{old} moved to servelab.{new} (the old path goes in servelab {REMOVED_IN}); "
                        "plugins import servelab.plugin_api"], (old, said)
