"""Helpers shared by the experiments' ``analyze.py`` scripts: read a Hydra multirun folder, note
the machine, write markdown tables, save plots. Each run folder holds ``summary.json``,
``requests.jsonl``, ``config.yaml`` (resolved), ``.hydra/overrides.yaml`` (what the sweep set) and,
with ``debug.log_steps=true``, ``steps.jsonl``."""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import sys
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

import matplotlib
import yaml

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt

from servelab.sim.step_profile import cpu_model as profile_cpu_model

REPO = Path(__file__).resolve().parent.parent


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line]


@dataclass
class Run:
    """One finished job of a sweep; ``requests`` is read on first use."""

    path: Path
    overrides: dict[str, str]
    config: dict
    summary: dict

    @cached_property
    def requests(self) -> list[dict]:
        """The run's ``requests.jsonl``, one dict per request."""
        return _jsonl(self.path / "requests.jsonl")

    def steps(self) -> list[dict] | None:
        """The run's ``steps.jsonl`` (one dict per engine step), or None when it logged no steps."""
        path = self.path / "steps.jsonl"
        return _jsonl(path) if path.is_file() else None


def latest_sweep(name: str) -> Path:
    """The newest ``multirun/<name>/<timestamp>`` folder."""
    root = REPO / "multirun" / name
    sweeps = sorted(p for p in root.glob("*") if p.is_dir()) if root.is_dir() else []
    if not sweeps:
        raise SystemExit(f"no runs under {root}: run `python run.py -m experiment={name}` first")
    return sweeps[-1]


def optional_sweep(name: str, index: int = 0) -> Path | None:
    """The ``index``-th sweep named on the command line, else the newest of ``multirun/<name>/``, else None."""
    sweep = sweep_arg(index)
    if sweep is None:
        try:
            sweep = latest_sweep(name)
        except SystemExit:
            sweep = None
    return sweep


def _job_order(job: Path) -> tuple[int, str]:
    """Hydra numbers its jobs ``<n>`` or ``<n>_<overrides>``: sort by that number."""
    head = job.name.split("_")[0]
    return (int(head) if head.isdigit() else -1, job.name)


def load_runs(sweep_dir: Path, strict: bool = True) -> list[Run]:
    """Every finished job (one with a ``summary.json``) of a multirun folder, in job order.

    ``strict``: exit unless there is one and every run completed without leaking blocks.
    """
    runs = []
    for job in sorted(sweep_dir.iterdir(), key=_job_order):
        if not (job / "summary.json").is_file():
            continue
        overrides_file = job / ".hydra" / "overrides.yaml"
        overrides = (yaml.safe_load(overrides_file.read_text()) if overrides_file.is_file() else None) or []
        runs.append(Run(
            path=job,
            overrides=dict(o.lstrip("+").split("=", 1) for o in overrides),
            config=yaml.safe_load((job / "config.yaml").read_text()),
            summary=json.loads((job / "summary.json").read_text()),
        ))
    if not strict:
        return runs
    if not runs:
        raise SystemExit(f"{sweep_dir}: no finished runs (no summary.json)")
    bad = [r.path.name for r in runs if r.summary.get("status") != "completed" or r.summary.get("leaked_blocks")]
    if bad:
        raise SystemExit(f"{sweep_dir}: runs not completed cleanly (or leaking blocks): {bad}")
    return runs


def cpu_model(default: str) -> str:
    """The CPU's model name from ``/proc/cpuinfo``, else ``default``."""
    return profile_cpu_model(default)


def machine_note(sweep_dir: Path) -> str:
    """Date of the runs and the machine they ran on."""
    when = dt.datetime.fromtimestamp(sweep_dir.stat().st_mtime).strftime("%Y-%m-%d %H:%M")
    cpu = cpu_model(platform.processor() or platform.machine())
    import torch

    return (f"Runs of {when} on {platform.node() or 'an unnamed host'}: {cpu}, {os.cpu_count()} CPU cores "
            f"(shared with other jobs), no GPU; Python {platform.python_version()}, torch {torch.__version__}. "
            + clock_note(sweep_dir))


def clock_note(sweep_dir: Path) -> str:
    """Which clock and time model made the runs' times (from their summary.json)."""
    summaries = sorted(sweep_dir.glob("*/summary.json"))
    if not summaries:
        return ""
    s = json.loads(summaries[0].read_text())
    if s.get("clock") != "virtual":
        return "Clock: wall (times measured as the runs went, on a shared machine: they move between repeats)."
    tm = s.get("time_model") or {}
    if tm.get("path"):  # a profile: the machine it measured
        m = (tm.get("source") or {}).get("machine", {})
        what = f"`{tm['path']}`, measured on {m.get('processor', '?')} x {m.get('cores', '?')} cores, 1 thread"
    else:
        what = f"hardware {s.get('hardware')}"
    return (f"Clock: virtual; time model `{tm.get('name')}` ({what}): every time in these tables is a "
            "deterministic function of config + workload + seed, and reproduces on any machine.")


def cell(v) -> str:
    """A table cell: floats get 3 significant digits (thousands separators from 1000 on), None is "-"."""
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 1000 else f"{v:,.0f}"
    return str(v)


def table(headers: list[str], rows: list[list], fmt=cell) -> str:
    """A markdown table; ``fmt`` writes each value (:func:`cell`: floats get 3 significant digits)."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def save_figure(fig, *paths: Path, dpi: int = 120) -> None:
    """Lay ``fig`` out tightly, write it to each of ``paths`` and close it."""
    fig.tight_layout()
    for path in paths:
        fig.savefig(path, dpi=dpi)
    plt.close(fig)


def write_page(folder: Path, text: str) -> None:
    """``folder/README.md`` = ``text``, echoed to stdout."""
    (folder / "README.md").write_text(text)
    print(text)


UPDATE_FLAG = "--update-readme"


def sweep_arg(index: int = 0) -> Path | None:
    """The ``index``-th sweep folder named on the command line (``--update-readme`` aside), if any;
    ``-h``/``--help`` prints the script's docstring and exits."""
    if {"-h", "--help"} & set(sys.argv[1:]):
        print((sys.modules["__main__"].__doc__ or "").strip())
        raise SystemExit(0)
    args = [a for a in sys.argv[1:] if a != UPDATE_FLAG]
    return Path(args[index]) if len(args) > index else None


def output_dir(here: Path, sweep: Path | None, name: str) -> Path:
    """Where an analysis writes. Only with ``--update-readme`` the experiment's folder (its
    committed README and plots); otherwise ``<sweep>/analysis`` (``multirun/<name>/analysis``
    without a sweep), which also gets ``servelab compare``'s table of the sweep (compare.md/.csv)."""
    if UPDATE_FLAG in sys.argv[1:]:
        return here
    out = (sweep if sweep is not None else REPO / "multirun" / name) / "analysis"
    out.mkdir(parents=True, exist_ok=True)
    if sweep is not None:
        from servelab.cli.compare import DEFAULT_METRICS, comparison, find_runs, load_run, write_table

        runs = [load_run(r) for r in find_runs([sweep])]
        header, rows = comparison(runs, [m for m in DEFAULT_METRICS if any(m in r["summary"] for r in runs)])
        for suffix in (".md", ".csv"):
            write_table(header, rows, out / f"compare{suffix}")
    print(f"analysis written to {out} (the committed README and plots: rerun with {UPDATE_FLAG})", flush=True)
    return out


def open_sweep(here: Path, name: str, sweep: Path | None = None) -> tuple[Path, Path]:
    """The sweep an analysis reads and the folder it writes (:func:`output_dir`): ``sweep``, else the
    one named on the command line, else the newest ``multirun/<name>/`` folder."""
    sweep = sweep or sweep_arg() or latest_sweep(name)
    return sweep, output_dir(here, sweep, name)
