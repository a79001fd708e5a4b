"""The page's markup: a title, a table of each run's headline figures, then the figures by section.

One file with its style inline and no script; it refers only to the PNGs in its figures folder.
"""

from __future__ import annotations

from html import escape
from typing import Any

from servelab.results.page.figures import Figure
from servelab.results.page.runs import RunData

#: (summary key, label, how to show it); a row is left out when no run has the key
ROWS = (
    ("status", "status", "{}"),
    ("num_requests", "requests", "{:,}"),
    ("num_finished", "finished", "{:,}"),
    ("num_rejected", "rejected", "{:,}"),
    ("duration_s", "duration (s)", "{:,.2f}"),
    ("output_throughput_tok_s", "output tokens/s", "{:,.1f}"),
    ("ttft_ms.p50", "TTFT p50 (ms)", "{:,.2f}"),
    ("ttft_ms.p99", "TTFT p99 (ms)", "{:,.2f}"),
    ("tpot_ms.p50", "TPOT p50 (ms)", "{:,.2f}"),
    ("tpot_ms.p99", "TPOT p99 (ms)", "{:,.2f}"),
    ("e2e_ms.p99", "E2E p99 (ms)", "{:,.1f}"),
    ("slo_attainment", "SLO attainment", "{:.1%}"),
    ("goodput_req_s", "goodput (req/s)", "{:,.2f}"),
    ("num_preemptions", "preemptions", "{:,}"),
    ("kv_utilization_max", "KV use, highest", "{:.1%}"),
    ("prefix_cache_hit_rate", "prefix-cache hits", "{:.1%}"),
    ("num_replicas", "replicas", "{:,}"),
    ("router", "router", "{}"),
    ("load_imbalance", "load imbalance", "{:.2f}"),
    ("kv_tier_policy", "KV tier policy", "{}"),
    ("kv_tier_hit_rate", "KV tier hit rate", "{:.1%}"),
)
STYLE = """
body { font-family: system-ui, sans-serif; margin: 2em auto; max-width: 1000px; color: #222; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 2em; border-bottom: 1px solid #ccc; }
table { border-collapse: collapse; font-size: 0.9em; } td, th { padding: 0.2em 0.8em; border-bottom: 1px solid #eee; }
td { text-align: right; } th { text-align: left; } figure { margin: 1.5em 0; }
img { max-width: 100%; } figcaption { font-size: 0.85em; color: #444; max-width: 850px; }
.muted { color: #777; font-size: 0.85em; }
"""


def _value(summary: dict, dotted: str):
    node: Any = summary
    for part in dotted.split("."):
        if not isinstance(node, dict):
            return None
        node = node.get(part)
    return node


def _cell(value, fmt: str) -> str:
    if value is None:
        return "n/a"
    try:
        return fmt.format(value)
    except (TypeError, ValueError):
        return str(value)


def summary_table(runs: list[RunData]) -> str:
    """One column per run, one row per headline figure some run has."""
    head = "<tr><th></th>" + "".join(f"<th>{escape(r.label)}</th>" for r in runs) + "</tr>"
    rows = []
    for key, label, fmt in ROWS:
        values = [_value(r.summary, key) for r in runs]
        if all(v is None for v in values):
            continue
        rows.append(f"<tr><th>{escape(label)}</th>" + "".join(f"<td>{escape(_cell(v, fmt))}</td>" for v in values)
                    + "</tr>")
    return "<table>\n" + head + "\n" + "\n".join(rows) + "\n</table>"


def page(runs: list[RunData], sections: list[tuple[str, list[Figure]]], folder: str, notes: list[str]) -> str:
    """The HTML of the page: ``sections`` (title, figures) in order, each figure from ``folder``."""
    title = "servelab report: " + (runs[0].label if len(runs) == 1 else f"{len(runs)} runs")
    where = "".join(f"<li><code>{escape(str(r.path))}</code> as <b>{escape(r.label)}</b></li>" for r in runs)
    body = [f"<h1>{escape(title)}</h1>", f"<ul class=muted>{where}</ul>", summary_table(runs)]
    body += [f"<p class=muted>{escape(n)}</p>" for n in notes]
    for heading, figures in sections:
        if not figures:
            continue
        body.append(f"<h2>{escape(heading)}</h2>")
        for f in figures:
            body.append(f'<figure><img src="{escape(folder)}/{escape(f.file)}" alt="{escape(f.title)}">'
                        f"<figcaption>{escape(f.caption)}</figcaption></figure>")
    return ("<!DOCTYPE html>\n<html lang=en><head><meta charset=utf-8>"
            f"<title>{escape(title)}</title><style>{STYLE}</style></head>\n<body>\n" + "\n".join(body)
            + "\n</body></html>\n")
