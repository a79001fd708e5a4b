#!/usr/bin/env python3
"""Type-check servelab with mypy (``[tool.mypy]`` in pyproject.toml).

    python scripts/typecheck.py [--repo DIR] [mypy options...]

Why not plain ``mypy``: ``pyproject.toml`` maps ``servelab`` to ``framework/`` and
``servelab.plugins`` / ``.kernels`` / ``.conf`` to folders beside it, a layout mypy cannot be told
about. As ``scripts/lint_imports.py`` does for import-linter, this script builds the installed layout
as a tree of links (``link_tree``) and runs ``mypy -p servelab`` on it. The tree and mypy's cache
live in one folder per checkout under the system's temporary folder, the same on every run, so that
the cache stays valid from one run to the next (a cold run takes about 25 s on 2 cores). Each finding is printed with the
path of the checkout's own file (``framework/core/x.py``, ``plugins/...``), not the link's.
The exit status is mypy's own: 0 when there are no findings.
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from lint_imports import TOP, link_tree  # this folder is not a package

FINDING = re.compile(r"^(?P<path>[^:\n]+\.pyi?)(?P<rest>:\d+:.*)$", re.MULTILINE)


def typecheck(repo: Path, args: list[str]) -> subprocess.CompletedProcess:
    """Run mypy on ``repo``'s linked tree; output captured, paths given as the checkout's own."""
    work = Path(tempfile.gettempdir()) / f"servelab-typecheck-{hashlib.sha1(str(repo).encode()).hexdigest()[:12]}"
    cache = work / "cache"
    work.mkdir(exist_ok=True)
    with open(work / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one run at a time rebuilds the tree and uses it
        root = work / "tree"
        shutil.rmtree(root, ignore_errors=True)
        link_tree(repo, root)
        env = dict(os.environ, MYPYPATH=str(root))
        done = subprocess.run(
            [sys.executable, "-m", "mypy", "--config-file", str(repo / "pyproject.toml"),
             "--cache-dir", str(cache), *args, "-p", TOP],
            cwd=root, env=env, capture_output=True, text=True)

        def own_path(m: re.Match) -> str:
            real = Path(os.path.realpath(root / m["path"]))
            try:
                return str(real.relative_to(repo)) + m["rest"]
            except ValueError:
                return m[0]

        done.stdout = FINDING.sub(own_path, done.stdout)
    return done


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repo", type=Path, default=Path(__file__).resolve().parent.parent,
                    help="the checkout to check (default: %(default)s)")
    known, rest = ap.parse_known_args(argv)
    done = typecheck(known.repo.resolve(), rest)
    sys.stdout.write(done.stdout)
    sys.stderr.write(done.stderr)
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
