"""Shared by the memory experiments' analyze.py scripts (runs are read by ``common.load_runs``):
write a README with a markdown table, the date and the machine."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

# The experiments folder is on sys.path (scripts run from it).
from common import REPO, cell, clock_note, cpu_model, table


def machine() -> str:
    cpu = cpu_model(platform.processor() or "unknown CPU")
    import torch

    return f"{cpu}, {os.cpu_count()} CPU cores, torch {torch.__version__}, Python {platform.python_version()}"


def git_commit() -> str:
    try:
        return subprocess.check_output(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, text=True).strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def markdown_table(rows: list[dict], columns: list[str]) -> str:
    """A markdown table of ``columns`` of ``rows``; floats get 4 significant digits."""
    return table(columns, [[r.get(c) for c in columns] for r in rows],
                 fmt=lambda v: f"{v:.4g}" if isinstance(v, float) else cell(v))


def _shown(path: Path) -> str:
    """Relative to the repo when inside it (the committed README), else absolute."""
    path = path.resolve()
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


def write_readme(folder: Path, title: str, command: str, sweep: Path, body: str) -> None:
    """``folder/README.md``: the experiment's (``--update-readme``) or the sweep's analysis folder."""
    now = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    script = Path(sys.argv[0]).resolve()
    text = (f"# {title}\n\n"
            f"Reproduce: `{command}` then `python {_shown(script)} --update-readme` "
            f"(reads the newest `multirun/{sweep.parent.name}/` folder).\n\n"
            f"Generated {now} on {machine()} (commit {git_commit()}, runs `{_shown(sweep)}`).\n"
            f"{clock_note(sweep)} Counts (steps, concurrency, waste, preemptions, tokens) do not depend on "
            f"the clock when all requests arrive at once.\n\n"
            f"{body}\n")
    (folder / "README.md").write_text(text)
