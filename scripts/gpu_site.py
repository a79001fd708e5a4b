#!/usr/bin/env python3
"""Make servelab importable on a machine with torch, triton and transformers but no network.

    python scripts/gpu_site.py DEST [--wheels .whl] [--force-tree]   # prints the PYTHONPATH entries to add
    python scripts/gpu_site.py --check                               # with them set: what imports, from where

Setting up (the first form), into ``DEST``:

1. the wheels under ``--wheels`` (made by ``scripts/gpu_wheels.sh``; none: nothing to install) go into
   ``DEST/site`` with ``pip install --no-index --no-deps --target``;
2. unless this Python already imports ``servelab`` from this checkout with its entry points (an editable
   install), ``DEST/tree`` gets the installed layout as a tree of links (``servelab`` = ``framework/`` plus
   ``plugins/``, ``kernels/``, ``conf/``, as ``pyproject.toml`` maps them; ``scripts/lint_imports.py``'s
   ``link_tree``) and a ``servelab-<version>.dist-info`` holding the entry points of ``pyproject.toml``,
   which is how the registry finds the built-in plugins. No setuptools, no build, no network.

It prints one line, the folders to put first on ``PYTHONPATH`` (``os.pathsep``-joined, maybe empty),
and exits 1 with one line naming the problem if pip fails. ``--check`` imports servelab and its
dependencies, composes the default stack and prints where each came from; it exits 1 if any is missing.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import os
import subprocess
import sys
import tomllib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from lint_imports import TOP, link_tree  # this folder is not a package

REPO = Path(__file__).resolve().parent.parent
# What the checks import beyond torch, triton and transformers (scripts/gpu_wheels.sh carries them).
CHECK_IMPORTS = ("hydra", "omegaconf", "antlr4", "yaml", "pluggy", "rich", "numpy", "safetensors", "torch",
                 "transformers")


def installed_from_checkout(repo: Path) -> bool:
    """True if this Python imports ``servelab`` from ``repo``'s ``framework/`` and has its entry points."""
    spec = importlib.util.find_spec(TOP)
    if spec is None or spec.origin is None:
        return False
    if Path(spec.origin).resolve().parent != (repo / "framework").resolve():
        return False
    try:
        return any(ep.group == TOP for ep in importlib.metadata.distribution(TOP).entry_points)
    except importlib.metadata.PackageNotFoundError:
        return False


def write_dist_info(repo: Path, dest: Path) -> Path:
    """``dest/servelab-<version>.dist-info`` with METADATA and the entry points of ``pyproject.toml``."""
    project = tomllib.loads((repo / "pyproject.toml").read_text())["project"]
    info = dest / f"{project['name']}-{project['version']}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {project['version']}\n")
    groups = dict(project.get("entry-points", {}))
    if project.get("scripts"):
        groups["console_scripts"] = project["scripts"]
    lines = []
    for group, entries in groups.items():
        lines.append(f"[{group}]")
        lines += [f"{name} = {target}" for name, target in entries.items()]
        lines.append("")
    (info / "entry_points.txt").write_text("\n".join(lines))
    return info


def install_wheels(wheels: Path, target: Path) -> None:
    """``pip install`` every wheel in ``wheels`` into ``target``, offline, without dependencies."""
    files = sorted(str(p) for p in wheels.glob("*.whl"))
    target.mkdir(parents=True, exist_ok=True)
    done = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                           "--no-cache-dir", "--upgrade", "--target", str(target), *files],
                          capture_output=True, text=True)
    if done.returncode:
        sys.stderr.write(done.stdout + done.stderr)
        raise SystemExit(f"gpu_site: pip could not install the wheels of {wheels} into {target} (output above)")


def set_up(dest: Path, wheels: Path | None, force_tree: bool) -> list[Path]:
    """Install and link as the module docstring says; the folders to put first on ``PYTHONPATH``."""
    entries = []
    if wheels is not None and any(wheels.glob("*.whl")):
        install_wheels(wheels, dest / "site")
        entries.append(dest / "site")
    if force_tree or not installed_from_checkout(REPO):
        tree = dest / "tree"
        if tree.exists():
            raise SystemExit(f"gpu_site: {tree} exists; give an empty DEST")
        link_tree(REPO, tree)
        write_dist_info(REPO, tree)
        entries.insert(0, tree)
    return entries


def check() -> int:
    """Import what the checks need and compose the default stack; one line each."""
    missing = []
    for name in CHECK_IMPORTS:
        try:
            module = __import__(name)
        except ImportError as exc:
            missing.append(f"{name} ({exc})")
            continue
        print(f"{name:<13} {getattr(module, '__version__', ''):<16} {Path(module.__file__ or '?').parent}")
    try:
        import servelab  # noqa: PLC0415 - the point of --check: does it import (with the PYTHONPATH set)
        from servelab.api import compose  # noqa: PLC0415 - likewise

        compose(["model=tiny", "logger=none"])
        builtin = [ep.name for ep in importlib.metadata.entry_points(group=TOP)]
        print(f"servelab      {importlib.metadata.version(TOP):<16} {Path(servelab.__file__).parent} "
              f"(entry points: {', '.join(sorted(builtin))})")
        if Path(servelab.__file__).resolve().parent != (REPO / "framework").resolve():
            missing.append(f"servelab from this checkout (imported {servelab.__file__})")
    except Exception as exc:  # noqa: BLE001 - any failure here is the finding to report
        missing.append(f"servelab ({type(exc).__name__}: {exc})")
    for what in missing:
        print(f"gpu_site: cannot import {what}")
    return 1 if missing else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dest", nargs="?", type=Path, help="an empty folder for site/ and tree/")
    ap.add_argument("--wheels", type=Path, default=None, help="a folder of wheels (scripts/gpu_wheels.sh)")
    ap.add_argument("--force-tree", action="store_true", help="link the tree even if servelab is installed")
    ap.add_argument("--check", action="store_true", help="import everything; print where from")
    args = ap.parse_args(argv)
    if args.check:
        return check()
    if args.dest is None:
        ap.error("DEST is required unless --check")
    print(os.pathsep.join(str(p) for p in set_up(args.dest.resolve(), args.wheels, args.force_tree)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
