"""The figures of a ``servelab bench`` sweep: one curve row per load point (``curve.csv``), the plot
(``curve.png``) and the knee where the SLO stops holding (``knee.json``).

A point *holds* the SLO when it completed with every request finished (none rejected or left
unfinished) and the ``percentile``-th TTFT and TPOT of its requests (``requests.jsonl``, numpy's
linear percentile, as ``summary.json``'s p50/p90/p99) are within ``slo.ttft_ms`` / ``slo.tpot_ms``
(each one that is set). The knee is the highest load before the first point, in increasing load,
that does not hold; points past that one that hold again are named (``holds_again``), never hidden.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np

LATENCIES = ("ttft_ms", "tpot_ms", "e2e_ms")
PERCENTILES = ("p50", "p90", "p99")
COLUMNS = ("point", "folder", "load_kind", "load", "status", "request_throughput_req_s", "output_throughput_tok_s",
           *(f"{m}_{p}" for m in LATENCIES for p in PERCENTILES),
           "slo_attainment", "ttft_slo_attainment", "tpot_slo_attainment", "goodput_req_s", "slo_holds")


def curve_row(point: int, folder: Path, kind: str, load: float, status: str, summary: dict) -> dict:
    """One ``curve.csv`` row (``slo_holds`` is filled by :func:`knee`); figures empty where the point has none."""
    row: dict = {"point": point, "folder": folder.name, "load_kind": kind, "load": load, "status": status}
    row["request_throughput_req_s"] = summary.get("request_throughput_req_s")
    row["output_throughput_tok_s"] = summary.get("output_throughput_tok_s")
    for metric in LATENCIES:
        figures = summary.get(metric) or {}
        for p in PERCENTILES:
            row[f"{metric}_{p}"] = figures.get(p)
    for key in ("slo_attainment", "ttft_slo_attainment", "tpot_slo_attainment", "goodput_req_s"):
        row[key] = summary.get(key)
    row["slo_holds"] = None
    return row


def slo_holds(folder: Path, summary: dict, status: str, slo: dict, percentile: float) -> tuple[bool, str]:
    """Whether the point in ``folder`` holds ``slo`` (``{"ttft_ms": x|None, "tpot_ms": y|None}``) at
    ``percentile``, and why not (one phrase; "" when it holds)."""
    if status != "completed":
        return False, status
    unfinished = (summary.get("num_requests") or 0) - (summary.get("num_finished") or 0)
    if unfinished:
        return False, f"{unfinished} requests did not finish"
    records = [json.loads(line) for line in (folder / "requests.jsonl").read_text().splitlines() if line.strip()]
    for metric, target in slo.items():
        if target is None:
            continue
        values = np.array([r[metric] for r in records if r.get(metric) is not None], dtype=float)
        if values.size and float(np.percentile(values, percentile)) > target:
            return False, f"p{percentile:g} {metric} {float(np.percentile(values, percentile)):.1f} > {target:g}"
    return True, ""


def knee(rows: list[dict], verdicts: list[tuple[bool, str]], slo: dict, percentile: float) -> dict:
    """``knee.json``: the knee's load and row, and every point's verdict (``rows`` in increasing
    load; each row's ``slo_holds`` is set here)."""
    kind = rows[0]["load_kind"] if rows else None
    if all(v is None for v in slo.values()):
        return {"load_kind": kind, "knee": None, "percentile": percentile, "slo": slo,
                "message": "no SLO configured (set slo.ttft_ms and/or slo.tpot_ms): no knee"}
    for row, (holds, _) in zip(rows, verdicts):
        row["slo_holds"] = holds
    first_miss = next((i for i, (holds, _) in enumerate(verdicts) if not holds), len(rows))
    best = rows[first_miss - 1] if first_miss else None
    again = [r["load"] for r in rows[first_miss + 1:] if r["slo_holds"]]
    slo_text = " and ".join(f"p{percentile:g} {m} <= {t:g}" for m, t in slo.items() if t is not None)
    if best is None:
        message = f"the SLO ({slo_text}) does not hold at the lowest load, {kind}={rows[0]['load']:g}: " \
                  f"{verdicts[0][1]}" if rows else "no points"
    elif first_miss == len(rows):
        message = f"knee: {kind}={best['load']:g} (the SLO, {slo_text}, holds at every point; the knee is past the sweep)"
    else:
        miss = rows[first_miss]
        message = (f"knee: {kind}={best['load']:g} ({best['request_throughput_req_s']:.3g} req/s); the SLO ({slo_text}) "
                   f"stops holding at {kind}={miss['load']:g}: {verdicts[first_miss][1]}")
    if again:
        message += f"; it holds again at {kind}={', '.join(f'{x:g}' for x in again)}"
    return {"load_kind": kind, "knee": best["load"] if best else None, "past_the_sweep": first_miss == len(rows),
            "percentile": percentile, "slo": slo, "knee_point": best, "holds_again": again,
            "points": [{"load": r["load"], "holds": h, "why_not": why or None} for r, (h, why) in zip(rows, verdicts)],
            "message": message}


def write_curve_csv(rows: list[dict], path: Path) -> None:
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=COLUMNS)
        writer.writeheader()
        for row in rows:
            writer.writerow({k: "" if row.get(k) is None else row[k] for k in COLUMNS})


def plot_curve(rows: list[dict], slo: dict, path: Path) -> None:
    """Throughput (req/s) on x, the latency percentiles on y, one panel per metric; the SLO as a
    dashed line where set; each point labelled with its load."""
    import matplotlib  # noqa: PLC0415 - only a bench draws

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    done = [r for r in rows if r["request_throughput_req_s"] is not None]
    fig, axes = plt.subplots(1, len(LATENCIES), figsize=(5 * len(LATENCIES), 4))
    for ax, metric in zip(axes, LATENCIES):
        x = [r["request_throughput_req_s"] for r in done]
        for p in PERCENTILES:
            ax.plot(x, [r[f"{metric}_{p}"] if r[f"{metric}_{p}"] is not None else np.nan for r in done],
                    marker="o", label=p)
        target = slo.get(metric)
        if target is not None:
            ax.axhline(target, color="red", linestyle="--", linewidth=1, label="SLO")
        for r in done:
            y = r[f"{metric}_p50"]
            if y is not None:
                ax.annotate(f"{r['load']:g}", (r["request_throughput_req_s"], y), textcoords="offset points",
                            xytext=(3, -10), fontsize=7)
        ax.set_xlabel("throughput (req/s)")
        ax.set_ylabel(f"{metric.split('_')[0].upper()} (ms)")
        ax.set_title(metric.split("_")[0].upper())
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    kind = rows[0]["load_kind"] if rows else ""
    fig.suptitle(f"servelab bench: latency against throughput (points labelled with {kind})")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
