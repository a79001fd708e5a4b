"""The end-of-run summary table (rich)."""

from __future__ import annotations

import unicodedata
from pathlib import Path
from typing import Iterable

from rich.console import Console
from rich.table import Table
from rich.text import Text


def _fmt(v) -> str:
    """``None`` (a metric with nothing to cover, e.g. SLO attainment without targets) is n/a. A float
    under 1 keeps three significant digits: a KV use of 0.0011 must not read 0.00."""
    if v is None:
        return "n/a"
    if not isinstance(v, float):
        return str(v)
    if v == 0 or abs(v) >= 1:
        return f"{v:,.2f}"
    small = f"{v:.3g}"
    return small if "." in small or "e" in small else f"{v:.2f}"  # 0.9999 -> 1.00, not 1


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
    _tier_rows(table, summary)
    _fairness_rows(table, summary)
    console.print(table)
    print_rejections(summary, console)
    # plain print: a path rich wraps over two lines cannot be copied
    html, summary_file = Path(output_dir) / "report.html", Path(output_dir) / "summary.json"
    fresh = html.is_file() and summary_file.is_file() and html.stat().st_mtime >= summary_file.stat().st_mtime
    page = ", report.html" if fresh else ""  # report=true drew this run's page
    print(f"results: {output_dir}/requests.jsonl, summary.json{page}", flush=True)


def _count(v) -> str:
    return f"{v:,}" if isinstance(v, int) else _fmt(v)


def _tier_rows(table: Table, summary: dict) -> None:
    """The KV tiers' figures (docs/metrics.md, "KV tiers"), when the run had a tiered store: its policy,
    the hit rate over the prompt blocks the GPU cache missed, per tier the blocks loaded from it and
    stored into it, and the load time (added to steps / hidden behind compute)."""
    tiers = summary.get("kv_tiers")
    if not tiers:
        return
    table.add_row("kv_tier_policy", str(summary.get("kv_tier_policy")))
    table.add_row("kv_tier_hit_rate", _fmt(summary.get("kv_tier_hit_rate")))
    per_block = summary.get("bytes_per_block") or 0
    for tier in tiers:
        stored = tier["written_bytes"] // per_block if per_block else None
        table.add_row(f"kv_tiers.{tier['kind']} hit / loaded / stored",
                      f"{_fmt(tier['hit_rate'])} / {_count(tier['hit_blocks'])} / {_count(stored)}")
    table.add_row("kv_tier_requests_loaded", _count(summary.get("kv_tier_requests_loaded")))
    table.add_row("kv_tier_load_added_s / hidden_s",
                  f"{_fmt(summary.get('kv_tier_load_added_s'))} / {_fmt(summary.get('kv_tier_load_hidden_s'))}")
    if summary.get("kv_tier_prefetch_blocks"):
        table.add_row("kv_tier_prefetch_blocks used / wasted",
                      f"{_count(summary['kv_tier_prefetch_used_blocks'])} / "
                      f"{_count(summary['kv_tier_prefetch_wasted_blocks'])}")


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


# how each finish reason reads in the samples' header and labels
FINISH_WORDS = {"stop": "ended at EOS", "length": "hit the length limit (max_tokens or max_model_len)",
                "abort": "aborted", None: "unfinished"}


def print_samples(requests: Iterable[dict], console: Console | None = None, limit: int = 3,
                  prompt_chars: int = 240, max_ids: int = 16) -> None:
    """A few prompt -> completion pairs (records with ``output_text``: checkpoints with a tokenizer) and
    how every request ended. The samples are a mix: those that ended by themselves (EOS: a whole
    definition reads best) and at least one of each other ending there is (a request cut at its
    ``max_tokens``, the common case for a short ``max_tokens``), each labelled with its
    ``finish_reason``. Each is labelled ``prompt:`` / ``completion:`` in words, so the pair survives a
    pipe (no colour there). A side that is not text (a token-id workload's random ids, or a
    random-weight model's output, decode to control bytes and broken UTF-8) shows the prompt's length
    or the first ``max_ids`` output token ids instead."""
    by_reason: dict = {}  # finish reason -> the first `limit` records that ended so
    counts: dict = {}
    for r in requests:
        if "output_text" not in r:
            return  # no tokenizer: no record has text
        reason = r.get("finish_reason")
        counts[reason] = counts.get(reason, 0) + 1
        if reason is not None and len(by_reason.setdefault(reason, [])) < limit:
            by_reason[reason].append(r)
    shown = _mix(by_reason, counts, limit)
    if not shown:
        return
    console = console or Console()
    total = sum(counts.values())
    ended = "; ".join(f"{n} finish={reason}: {FINISH_WORDS.get(reason, reason)}"
                      for reason, n in sorted(counts.items(), key=lambda kv: -kv[1]))
    console.print(Text.assemble(("sample completions", "bold"), f" (of {total} requests: {ended}; all in "
                                "requests.jsonl)"), soft_wrap=True)
    for r in shown:
        console.rule(Text(f"{r['id']}: {r['output_len']} tokens, finish={r['finish_reason']} "
                          f"({FINISH_WORDS.get(r['finish_reason'], r['finish_reason'])})"), style="dim")
        _print_sample(console, r, prompt_chars, max_ids)
    console.rule(style="dim")


def _mix(by_reason: dict, counts: dict, limit: int) -> list[dict]:
    """Up to ``limit`` samples: one of each finish reason first (EOS first, then the commonest), then
    the rest filled in the same order."""
    order = sorted(by_reason, key=lambda reason: (reason != "stop", -counts[reason]))
    shown = [by_reason[reason][0] for reason in order][:limit]
    for reason in order:
        for r in by_reason[reason][1:]:
            if len(shown) < limit:
                shown.append(r)
    return shown


def _print_sample(console: Console, r: dict, prompt_chars: int, max_ids: int) -> None:
    prompt, output = r.get("prompt_text") or "", r.get("output_text") or ""
    if not is_text(prompt):
        console.print(Text(f"prompt:     {r['prompt_len']} token ids (not text: a token-id workload)"), soft_wrap=True)
    else:
        if len(prompt) > prompt_chars:
            prompt = "…" + prompt[-prompt_chars:]
        console.print(Text("prompt:     ", style="bold") + Text(prompt, style="dim"), soft_wrap=True)
    if not is_text(output.rstrip("\ufffd")):  # (an output may end inside a character)
        ids = r.get("output_token_ids") or []
        more = f" ... (+{len(ids) - max_ids})" if len(ids) > max_ids else ""
        console.print(Text(f"completion: token ids {ids[:max_ids]}{more} (not text)"), soft_wrap=True)
    else:
        console.print(Text("completion: ", style="bold") + Text(output, style="bold green"), soft_wrap=True)


def is_text(s: str) -> bool:
    """Whether ``s`` reads as text: no control or unassigned characters (newline and tab aside) and
    no U+FFFD (bytes that were not UTF-8)."""
    return "\ufffd" not in s and all(c in "\n\t" or not unicodedata.category(c).startswith("C") for c in s)


def all_rejected_error(summary: dict) -> str | None:
    """The error of a run whose every request was rejected (it measured nothing), else None."""
    n, rejected = summary.get("num_requests", 0), summary.get("num_rejected", 0)
    if not n or rejected < n:
        return None
    kinds = summary.get("rejections") or {"?": {"example_id": "?", "example_reason": "unknown"}}
    entry = next(iter(kinds.values()))
    more = f" (and {len(kinds) - 1} other kinds of reason, listed above)" if len(kinds) > 1 else ""
    return f"every request ({n}) was rejected, e.g. request {entry['example_id']!r}: {entry['example_reason']}{more}"
