#!/usr/bin/env python3
"""Check servelab's import contracts (``[tool.importlinter]`` in pyproject.toml) with import-linter.

    python scripts/lint_imports.py [--repo DIR] [lint-imports options...]

Why not plain ``lint-imports``: it finds ``servelab`` with importlib and walks that one folder
(``framework/``), but ``pyproject.toml`` maps ``servelab.plugins``, ``servelab.kernels`` and
``servelab.conf`` from folders beside it, which the walk would miss. This script builds the
installed layout as a tree of links in a temporary folder (``servelab/`` = the entries of
``framework/`` plus ``plugins/``, ``kernels/``, ``conf/``), puts it first on ``PYTHONPATH`` and runs
``lint-imports`` there. ``--repo`` checks another checkout (default: this script's repository).
The exit status is lint-imports' own: 0 when every contract is kept.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

TOP = "servelab"


def link_tree(repo: Path, dest: Path) -> Path:
    """Make ``dest/servelab`` mirror the installed package of ``repo``; return ``dest``."""
    mapping = tomllib.loads((repo / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    top = (repo / mapping[TOP]).resolve()
    pkg = dest / TOP
    pkg.mkdir(parents=True)
    for entry in top.iterdir():
        if entry.name != "__pycache__":
            (pkg / entry.name).symlink_to(entry)
    # mapped packages that live outside the top folder (servelab.plugins -> plugins/, ...)
    for name, rel in sorted(mapping.items()):
        folder = (repo / rel).resolve()
        if not name.startswith(TOP + ".") or folder == top or top in folder.parents:
            continue
        parts = name.split(".")[1:]
        at = pkg.joinpath(*parts)
        if at.exists() or at.is_symlink():  # a sub-package of one linked already
            continue
        at.parent.mkdir(parents=True, exist_ok=True)
        at.symlink_to(folder)
    return dest


def lint_imports(repo: Path, args: list[str]) -> subprocess.CompletedProcess:
    """Run lint-imports on ``repo``'s contracts over its linked tree; output captured."""
    exe = Path(sys.executable).with_name("lint-imports")
    cmd = [str(exe)] if exe.exists() else [shutil.which("lint-imports") or "lint-imports"]
    with tempfile.TemporaryDirectory(prefix="servelab-lint-") as tmp:
        root = link_tree(repo, Path(tmp) / "tree")
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            [str(root), *filter(None, [os.environ.get("PYTHONPATH")])]))
        return subprocess.run([*cmd, str(repo / "pyproject.toml"), "--no-cache", *args],
                              cwd=tmp, env=env, capture_output=True, text=True)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repo", type=Path, default=Path(__file__).resolve().parent.parent,
                    help="the checkout to check (default: %(default)s)")
    known, rest = ap.parse_known_args(argv)
    done = lint_imports(known.repo.resolve(), rest)
    sys.stdout.write(done.stdout)
    sys.stderr.write(done.stderr)
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
