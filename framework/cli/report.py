"""``servelab report``: a picture of runs, one page.

    servelab report outputs/2026-12-07/10-00-00                   # report.html in the run's folder
    servelab report multirun/x/0_scheduler=fcfs multirun/x/1_scheduler=slo_aware --out cmp   # overlaid
    servelab report multirun/x                                      # every job of a multirun, overlaid

Writes ``report.html`` and, beside it, ``report_figures/`` (PNGs): TTFT, TPOT and end-to-end latency
distributions against the SLO targets; requests running and waiting, KV use, tokens per step and
preemptions over time (from ``timeline.npz``); for a cluster, requests placed, time busy and load per
replica; with KV tiers, hit rates and load time. Several runs overlay, one figure per metric and a
line per run, labelled by the overrides that set them apart (else by their folders). ``--out`` defaults to the run's folder (several runs: the
folder that holds them all). ``report=true`` writes the page at the end of a run. docs/results.md.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from servelab.results.page import write_page


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="servelab report", description=__doc__.split("\n\n", 1)[-1].replace("``", ""),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("runs", nargs="+", type=Path, help="run folders (each holds summary.json), or a multirun's folder")
    p.add_argument("--out", type=Path, help="folder for report.html and report_figures/ (default: see above)")
    args = p.parse_args(argv)
    page = write_page(args.runs, args.out)
    print(f"report: {page}")
    return 0
