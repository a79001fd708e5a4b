"""The end-of-run summary table (rich)."""

from __future__ import annotations

from typing import Iterable

from rich.console import Console
from rich.table import Table
from rich.text import Text


def _fmt(v) -> str:
    """``None`` (a metric with nothing to cover, e.g. SLO attainment without targets) is n/a."""
    return "n/a" if v is None else (f"{v:,.2f}" if isinstance(v, float) else str(v))


def print_summary(summary: dict, output_dir: str, console: Console | None = None) -> None:
    console = console or Console()
    table = Table(title=f"servelab run: {summary.get('status', '')}", show_header=True, header_style="bold")
    table.add_column("metric")
    table.add_column("value", justify="right")
    for key in ("num_requests", "num_finished", "num_rejected", "duration_s", "output_throughput_tok_s",
                "request_throughput_req_s", "num_preemptions", "kv_utilization_mean", "kv_utilization_max",
                "prefix_cache_hit_rate", "num_requests_with_slo", "slo_attainment", "goodput_req_s",
                "leaked_blocks"):
        if key in summary:
            table.add_row(key, _fmt(summary[key]))
    if summary.get("spec_acceptance_rate") is not None:  # speculative decoding ran
        # per verify step, then what ranks drafters: the passes saved (docs/metrics.md)
        for key, note in (("spec_acceptance_rate", ""), ("spec_mean_tokens_per_verify", " (verify steps only)"),
                          ("spec_steps_saved_fraction", " (drafted tokens kept / output tokens)")):
            if key in summary:
                table.add_row(key + note, _fmt(summary[key]))
    for key in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"):
        s = summary.get(key) or {}
        table.add_row(f"{key} mean / p50 / p99", " / ".join(_fmt(s.get(k)) for k in ("mean", "p50", "p99")))
    _fairness_rows(table, summary)
    console.print(table)
    print_rejections(summary, console)
    # plain print: a path rich wraps over two lines cannot be copied
    print(f"results: {output_dir}/requests.jsonl, summary.json", flush=True)


def _fairness_rows(table: Table, summary: dict, max_clients: int = 8) -> None:
    """The fairness figures, when the run had two or more clients (a server may have thousands:
    the first ``max_clients`` by id, then a count)."""
    by_client = summary.get("service_by_client")
    if not by_client:
        return
    for key in ("max_service_gap_tokens", "jain_fairness_index"):
        table.add_row(key, _fmt(summary.get(key)))
    for client, service in list(by_client.items())[:max_clients]:
        # Text: a client id is whatever a user sent, never rich markup
        table.add_row(Text(f"service_by_client.{client or '(anonymous)'}"), _fmt(service))
    if len(by_client) > max_clients:
        table.add_row("service_by_client", f"... {len(by_client) - max_clients} more clients (summary.json)")


def print_rejections(summary: dict, console: Console | None = None) -> None:
    """Rejected requests grouped by reason: count and the first request's id."""
    rejections = summary.get("rejections") or {}
    if not rejections:
        return
    console = console or Console()
    table = Table(title=f"rejected requests: {summary.get('num_rejected', '')}", header_style="bold")
    table.add_column("count", justify="right")
    table.add_column("reason (N: a number)", overflow="fold")
    table.add_column("example", overflow="fold")
    for kind, entry in rejections.items():
        table.add_row(str(entry["count"]), kind, f"{entry['example_id']}: {entry['example_reason']}")
    console.print(table)


def print_samples(requests: Iterable[dict], console: Console | None = None, limit: int = 3,
                  prompt_chars: int = 240) -> None:
    """A few prompt -> completion pairs (records with ``output_text``: checkpoints with a tokenizer),
    those that ended by themselves (EOS) first: a whole definition reads best."""
    stopped: list[dict] = []
    other: list[dict] = []
    for r in requests:
        if "output_text" not in r:
            return  # no tokenizer: no record has text
        if r.get("finish_reason") == "stop":
            stopped.append(r)
            if len(stopped) >= limit:
                break
        elif r.get("finish_reason") and len(other) < limit:
            other.append(r)
    shown = (stopped + other)[:limit]
    if not shown:
        return
    console = console or Console()
    console.print("[bold]sample completions[/bold] ([dim]prompt[/dim], [bold green]completion[/bold green]; "
                  "all in requests.jsonl)")
    for r in shown:
        prompt = r.get("prompt_text") or ""
        if len(prompt) > prompt_chars:
            prompt = "…" + prompt[-prompt_chars:]
        console.rule(f"{r['id']}: {r['output_len']} tokens, finish={r['finish_reason']}", style="dim")
        console.print(Text(prompt, style="dim") + Text(r["output_text"], style="bold green"), soft_wrap=True)
    console.rule(style="dim")


def all_rejected_error(summary: dict) -> str | None:
    """The error of a run whose every request was rejected (it measured nothing), else None."""
    n, rejected = summary.get("num_requests", 0), summary.get("num_rejected", 0)
    if not n or rejected < n:
        return None
    kinds = summary.get("rejections") or {"?": {"example_id": "?", "example_reason": "unknown"}}
    entry = next(iter(kinds.values()))
    more = f" (and {len(kinds) - 1} other kinds of reason, listed above)" if len(kinds) > 1 else ""
    return f"every request ({n}) was rejected, e.g. request {entry['example_id']!r}: {entry['example_reason']}{more}"
