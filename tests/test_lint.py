"""The linter and the type checker find nothing: ``ruff check`` and mypy, as pyproject.toml configures them.

ruff: ``[tool.ruff]`` (the default rules, every rule a ``# noqa`` names, RUF100 for a stale ``noqa``).
mypy: ``[tool.mypy]``, run by ``scripts/typecheck.py`` on the installed layout (a tree of links);
strict on ``servelab.core``, ``servelab.engine`` and ``servelab.plugin_api``. Both tools are in the
``dev`` extra; without one installed its test is skipped. A failure prints every finding.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def _need(module: str) -> None:
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed (it is in servelab's dev extra: pip install -e '.[dev]')")


def test_ruff_check_is_clean():
    _need("ruff")
    done = subprocess.run([sys.executable, "-m", "ruff", "check", "--no-cache", "--output-format", "concise", "."],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"ruff check found:\n{done.stdout}{done.stderr}"


def test_mypy_is_clean():
    _need("mypy")
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "typecheck.py")],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"mypy found:\n{done.stdout}{done.stderr}"
