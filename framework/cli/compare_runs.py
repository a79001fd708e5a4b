"""The runs ``servelab compare`` reads: every job folder of a sweep, whether it completed, stopped
early or failed before it wrote ``summary.json``, with its config, its summary and its status.

A job folder holds ``summary.json``, ``config.yaml``, ``.hydra/`` or ``error.txt`` (Hydra writes
``.hydra/`` before the job starts, so a job that failed at start-up has one). Its status is
``summary.json``'s ``status`` (``completed`` where an older run has none); without a readable
``summary.json``, ``failed: <error.txt's line>`` or ``no summary.json``.
"""

from __future__ import annotations

import json
from pathlib import Path

import yaml
from omegaconf import OmegaConf

from servelab.core.errors import ServelabError

COMPLETED = "completed"
NO_SUMMARY = "no summary.json"
JOB_MARKERS = ("summary.json", "config.yaml", ".hydra", "error.txt")


class CompareError(ServelabError):
    """A bad argument or folder, named in one line."""


def is_job_folder(path: Path) -> bool:
    """Whether ``path`` is a run's folder (it holds one of :data:`JOB_MARKERS`)."""
    return path.is_dir() and any((path / m).exists() for m in JOB_MARKERS)


def find_runs(paths: list[str | Path]) -> list[Path]:
    """Run folders: each path is one, or a folder holding some (a multirun: every job, in job order,
    completed or not). Paths keep the form given (relative stays relative)."""
    runs: list[Path] = []
    for p in map(Path, paths):
        if is_job_folder(p):
            runs.append(p)
        elif p.is_dir():
            found = sorted((d for d in p.iterdir() if is_job_folder(d)), key=lambda d: (_job_number(d), d.name))
            if not found:
                raise CompareError(f"{p}: no run folders in it (no */summary.json, */config.yaml or */.hydra)")
            runs.extend(found)
        else:
            raise CompareError(f"{p}: no such folder")
    return runs


def _job_number(d: Path) -> int:
    head = d.name.split("_", 1)[0]
    return int(head) if head.isdigit() else 1 << 30


def _flatten(d, prefix: str = "") -> dict:
    out = {}
    for k, v in (d or {}).items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


def load_run(path: Path) -> dict:
    """``{"path", "config" (flat), "summary" (flat; {} without one), "status" (one line)}`` of one run folder."""
    summary, status = _summary(path)
    return {"path": path, "config": _flatten(_config(path)), "summary": _flatten(summary),
            "status": " ".join(status.split())}


def _summary(path: Path) -> tuple[dict, str]:
    """The run's summary and status; a missing or half-written ``summary.json`` gives ``{}`` and why."""
    file = path / "summary.json"
    if not file.is_file():
        return {}, _failure(path)
    try:
        summary = json.loads(file.read_text())
    except ValueError:  # half-written: the job stopped while writing it
        return {}, "failed: summary.json is not valid JSON"
    if not isinstance(summary, dict):
        return {}, "failed: summary.json is not a JSON object"
    return summary, str(summary.get("status") or COMPLETED)


def _failure(path: Path) -> str:
    """``failed: <error.txt's first line>`` (a job that failed before writing results), else ``no summary.json``."""
    error = path / "error.txt"
    lines = error.read_text(errors="replace").strip().splitlines() if error.is_file() else []
    if not lines:
        return NO_SUMMARY
    return lines[0] if lines[0].startswith("failed") else f"failed: {lines[0]}"


def _config(path: Path) -> dict:
    """The run's resolved ``config.yaml``; else Hydra's ``.hydra/config.yaml`` (written before the job
    ran), its interpolations resolved where they can be; else ``{}``."""
    for file in (path / "config.yaml", path / ".hydra" / "config.yaml"):
        config = _read_yaml(file) if file.is_file() else None
        if isinstance(config, dict):
            return config
    return {}


def _read_yaml(file: Path):
    """The file's YAML (None where it is not YAML), ``${...}`` resolved where OmegaConf can."""
    try:
        config = yaml.safe_load(file.read_text())
    except yaml.YAMLError:
        return None
    if isinstance(config, dict) and "${" in file.read_text():
        try:
            return OmegaConf.to_container(OmegaConf.create(config), resolve=True)
        except Exception:  # noqa: BLE001 - an interpolation it cannot resolve here: the values as written
            return config
    return config


def status_kind(status: str) -> str:
    """What a status says in one word: ``completed``, ``interrupted``, ``failed``, ``partial``, or
    ``no summary.json``."""
    return status if status == NO_SUMMARY else status.split(":", 1)[0].strip() or NO_SUMMARY


def run_names(paths: list[Path]) -> list[str]:
    """Each run's folder name, with as many parent folders as tell it apart from the other runs'
    (``sweepA/0_block_size=24`` next to ``sweepB/0_block_size=24``); the name alone where it is unique."""
    parts = [p.resolve().parts for p in paths]

    def tail(ps: tuple[str, ...], k: int) -> str:
        return "/".join(ps[-k:])

    names = []
    for i, ps in enumerate(parts):
        k = 1
        while k < len(ps) and any(tail(q, k) == tail(ps, k) for j, q in enumerate(parts) if j != i):
            k += 1
        names.append(tail(ps, k))
    return names


def completed_only(runs: list[dict]) -> tuple[list[dict], str]:
    """The runs that completed, and one line naming the others with their status ("" when none)."""
    names = run_names([r["path"] for r in runs])
    others = [f"{n} ({r['status']})" for n, r in zip(names, runs) if r["status"] != COMPLETED]
    if not others:
        return runs, ""
    return ([r for r in runs if r["status"] == COMPLETED],
            f"servelab compare: --completed-only: {len(others)} of {len(runs)} runs did not complete, "
            f"left out: {'; '.join(others)}")
