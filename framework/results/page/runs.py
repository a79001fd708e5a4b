"""What the page reads of a run folder: :class:`RunData`, from the files every run writes.

A run folder holds ``summary.json`` (required; a folder of run folders, a multirun, stands for them), ``requests.jsonl``, ``config.yaml`` and ``timeline.npz``
(a run from before the timeline has none: its over-time figures are left out). A folder without a readable
``summary.json`` is a :class:`ReportError` naming it. Only keys the files already have are read.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import yaml

from servelab.core.errors import ServelabError
from servelab.engine.timeline import FILE as TIMELINE_FILE

LATENCIES = ("ttft_ms", "tpot_ms", "e2e_ms")


class ReportError(ServelabError):
    """A folder that is not a run, or an output the page cannot be written to: one line."""


@dataclass
class RunData:
    """One run as the page draws it. ``latencies``: each of :data:`LATENCIES` over the requests that
    have it (ms); ``timelines``: per replica, its columns (``time_s``, ``running``, ...) or ``{}``;
    ``config``: ``config.yaml`` as nested dicts ({} without one)."""

    path: Path
    summary: dict
    config: dict = field(default_factory=dict)
    latencies: dict[str, np.ndarray] = field(default_factory=dict)
    timelines: list[dict[str, np.ndarray]] = field(default_factory=list)
    label: str = ""

    def key(self, dotted: str, default=None):
        """A config value by its dotted key (``slo.ttft_ms``); ``default`` when absent."""
        node = self.config
        for part in dotted.split("."):
            if not isinstance(node, dict) or part not in node:
                return default
            node = node[part]
        return node

    @property
    def num_replicas(self) -> int:
        return len(self.summary.get("per_replica") or []) or 1

    def slo_targets(self, latency: str) -> dict[str, float]:
        """The targets of ``latency`` (``ttft_ms``, ``tpot_ms``) this run judged requests by, by label:
        ``SLO`` for ``slo.*``, ``SLO <class>`` for each of ``workload.slo_classes``; none for ``e2e_ms``."""
        if latency not in ("ttft_ms", "tpot_ms"):
            return {}
        targets = {}
        if self.key(f"slo.{latency}") is not None:
            targets["SLO"] = float(self.key(f"slo.{latency}"))
        for c in self.key("workload.slo_classes") or []:
            if isinstance(c, dict) and c.get(latency) is not None:
                targets[f"SLO {c.get('name')}"] = float(c[latency])
        return targets


def find_runs(paths: list[Path]) -> list[Path]:
    """The run folders ``paths`` name: each a run (it holds ``summary.json``) or a folder of runs (a
    multirun: those of its folders that hold one, in job order); anything else a :class:`ReportError`."""
    runs: list[Path] = []
    for p in paths:
        jobs = [] if (p / "summary.json").exists() or not p.is_dir() else \
            sorted((d for d in p.iterdir() if (d / "summary.json").is_file()), key=_job_order)
        runs.extend(jobs or [p])
    return runs


def _job_order(d: Path) -> tuple[int, str]:
    head = d.name.split("_", 1)[0]
    return (int(head) if head.isdigit() else 1 << 30, d.name)


def load_run(path: str | Path) -> RunData:
    """Read run folder ``path``; :class:`ReportError` when it is no run folder or its summary is unreadable."""
    path = Path(path)
    if not path.is_dir():
        raise ReportError(f"{path}: no such folder" if not path.exists() else f"{path}: not a folder")
    summary_file = path / "summary.json"
    if not summary_file.is_file():
        raise ReportError(f"{path}: not a run folder (no summary.json, nor a folder holding runs); give the folder "
                          "a run wrote its results to")
    try:
        summary = json.loads(summary_file.read_text())
    except (OSError, ValueError) as exc:
        raise ReportError(f"{summary_file}: cannot read it ({exc})") from None
    if not isinstance(summary, dict):
        raise ReportError(f"{summary_file}: not a run's summary (a JSON object)")
    return RunData(path, summary, _config(path), _latencies(path), _timelines(path, summary))


def _config(path: Path) -> dict:
    try:
        loaded = yaml.safe_load((path / "config.yaml").read_text())
    except (OSError, yaml.YAMLError):
        return {}
    return loaded if isinstance(loaded, dict) else {}


def _latencies(path: Path) -> dict[str, np.ndarray]:
    values: dict[str, list[float]] = {k: [] for k in LATENCIES}
    try:
        with (path / "requests.jsonl").open() as fh:
            for line in fh:
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue  # a line cut short by a kill: the others still tell
                for k, v in values.items():
                    x = rec.get(k) if isinstance(rec, dict) else None
                    if isinstance(x, (int, float)):
                        v.append(float(x))
    except OSError:
        pass
    return {k: np.asarray(v) for k, v in values.items()}


def _timelines(path: Path, summary: dict) -> list[dict[str, np.ndarray]]:
    """Per replica (``r<i>.<column>`` in ``timeline.npz``), in replica order; [] without the file."""
    try:
        with np.load(path / TIMELINE_FILE, allow_pickle=False) as z:
            arrays = {name: z[name] for name in z.files}
    except (OSError, ValueError):
        return []
    count = max((int(name.split(".", 1)[0][1:]) + 1 for name in arrays if name.startswith("r") and "." in name),
                default=0)
    return [{name.split(".", 1)[1]: a for name, a in arrays.items() if name.startswith(f"r{i}.")} for i in range(count)]


MAX_LABEL = 60  # characters of a label in a legend


def run_labels(paths: list[Path]) -> list[str]:
    """A label per run: with several runs that all recorded their overrides (``.hydra/overrides.yaml``),
    the overrides not shared by every run (``scheduler=fcfs``, where a multirun's job folder names repeat
    every override, hash-cut). A run with none of its own, every run where those do not tell them apart,
    and every run where some run has no such file: its folder's name, with as many parent folders as
    tell the runs apart (``a/0_x``, ``b/0_x``). At most :data:`MAX_LABEL` characters."""
    folders = _folder_labels(paths)
    overrides = _override_labels(paths) if len(paths) > 1 else None
    labels = [o or f for o, f in zip(overrides, folders)] if overrides else folders
    return [_cut(label) for label in (labels if len(set(labels)) == len(labels) else folders)]


def _override_labels(paths: list[Path]) -> list[str] | None:
    lists = []
    for p in paths:
        try:
            loaded = yaml.safe_load((p / ".hydra" / "overrides.yaml").read_text())
        except (OSError, yaml.YAMLError):
            return None
        if not isinstance(loaded, list):
            return None
        lists.append([str(o) for o in loaded])
    shared = set.intersection(*(set(o) for o in lists))
    return [" ".join(o for o in overrides if o not in shared) for overrides in lists]


def _folder_labels(paths: list[Path]) -> list[str]:
    resolved = [p.resolve() for p in paths]
    for depth in range(1, max(len(p.parts) for p in resolved) + 1):
        names = ["/".join(p.parts[-depth:]) for p in resolved]
        if len(set(names)) == len(names):
            return names
    return [str(p) for p in paths]  # the same folder twice


def _cut(label: str) -> str:
    return label if len(label) <= MAX_LABEL else label[:MAX_LABEL - 1] + "…"
