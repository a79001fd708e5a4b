""":func:`write_page`: read the runs, draw their figures, write ``report.html`` beside its figures folder."""

from __future__ import annotations

import os
from pathlib import Path

from servelab.results.page import figures as F
from servelab.results.page.html import page
from servelab.results.page.runs import LATENCIES, RunData, find_runs, load_run, run_labels
from servelab.results.writable import writable_folder

PAGE = "report.html"
FIGURES_FOLDER = "report_figures"  # beside PAGE; its PNGs are the page's (replaced on each write)


def default_out(paths: list[Path]) -> Path:
    """Where the page goes without ``--out``: the run's folder, or the folder that holds all the runs."""
    if len(paths) == 1:
        return paths[0]
    return Path(os.path.commonpath([p.resolve() for p in paths]))


def write_page(paths: list[str | Path], out: str | Path | None = None, option: str | None = None) -> Path:
    """The page of the runs in ``paths`` (several, or a multirun's folder: overlaid, labelled by their
    folders) in folder ``out`` (default :func:`default_out`): ``report.html`` and ``report_figures/*.png``;
    returns the page's path. A folder that is no run, or a folder the page cannot be written to (named
    by ``option``, default ``--out DIR``), is a one-line :class:`~servelab.core.errors.ServelabError`,
    raised before anything is drawn."""
    folders = find_runs([Path(p) for p in paths])
    runs = [load_run(p) for p in folders]
    folder_out = Path(out) if out is not None else default_out(folders)
    out = writable_folder(folder_out, option or (f"--out {out}" if out is not None else
                                                 f"--out not given, so {folder_out}"))
    for r, label in zip(runs, run_labels(folders)):
        r.label = label
    folder = out / FIGURES_FOLDER
    folder.mkdir(exist_ok=True)
    for old in folder.glob("*.png"):
        old.unlink()
    sections = [
        ("Latency", [F.latency_cdf(runs, k, folder) for k in LATENCIES]),
        ("Over time", [*(F.over_time(runs, c, folder) for c in F.SERIES), F.preemptions(runs, folder)]),
        ("Replicas", [F.routing(runs, folder), *(F.replica_load(r, i, folder) for i, r in enumerate(runs))]),
        ("KV tiers", [F.tier_hits(runs, folder), F.tier_load(runs, folder)]),
    ]
    drawn = [(title, [f for f in figs if f is not None]) for title, figs in sections]
    target = out / PAGE
    target.write_text(page(runs, drawn, FIGURES_FOLDER, notes(runs)))
    return target


def notes(runs: list[RunData]) -> list[str]:
    """What the page cannot show and why."""
    said = []
    for r in runs:
        if not any(len(t.get("time_s", ())) for t in r.timelines):
            said.append(f"{r.label}: no timeline.npz (a run from before servelab kept one, or no step ran): "
                        "no figures over time.")
        if not any(len(v) for v in r.latencies.values()):
            said.append(f"{r.label}: no request with a latency in requests.jsonl.")
    return said
