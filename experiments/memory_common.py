"""Shared by the memory experiments' analyze.py scripts: read a Hydra multirun folder, write a
README with a markdown table, the date and the machine."""

from __future__ import annotations

import json
import platform
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import yaml

from common import clock_note  # noqa: E402 - the experiments folder is on sys.path (scripts run from it)

REPO = Path(__file__).resolve().parents[1]


def latest_sweep(name: str) -> Path:
    """The newest ``multirun/<name>/<timestamp>`` folder."""
    runs = sorted((REPO / "multirun" / name).glob("*/"))
    if not runs:
        raise SystemExit(f"no runs under multirun/{name}/: run `python run.py -m experiment={name}` first")
    return runs[-1]


def load_runs(sweep: Path) -> list[dict]:
    """One dict per job: ``summary`` (summary.json), ``config`` (the resolved config) and ``job``."""
    runs = []
    for job in sorted(sweep.iterdir(), key=lambda p: int(p.name.split("_")[0]) if p.name[0].isdigit() else -1):
        if not (job / "summary.json").is_file():
            continue
        runs.append({"job": job.name, "summary": json.loads((job / "summary.json").read_text()),
                     "config": yaml.safe_load((job / "config.yaml").read_text())})
    return runs


def machine() -> str:
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                   if line.startswith("model name"))
    except (OSError, StopIteration):
        cpu = platform.processor() or "unknown CPU"
    import os

    import torch

    return f"{cpu}, {os.cpu_count()} CPU cores, torch {torch.__version__}, Python {platform.python_version()}"


def git_commit() -> str:
    try:
        return subprocess.check_output(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, text=True).strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def markdown_table(rows: list[dict], columns: list[str]) -> str:
    def fmt(v):
        if isinstance(v, float):
            return f"{v:.4g}"
        return "-" if v is None else str(v)

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(fmt(r.get(c)) for c in columns) + " |" for r in rows]
    return "\n".join(lines)


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
