"""Per-request results and the run summary (definitions follow vLLM's benchmark and Sarathi/Vidur).

TTFT = first token - arrival; TPOT = (e2e - TTFT) / (output tokens - 1); ITL = gaps between
consecutive tokens; queueing delay = first scheduled - arrival; goodput = requests meeting every
SLO per second.
"""

from __future__ import annotations

from array import array
from typing import Iterable

import numpy as np

from .request import Sequence, Status
from .step_totals import StepTotals


def request_record(seq: Sequence, time_scale: float, ttft_slo_ms: float | None,
                   tpot_slo_ms: float | None) -> dict:
    """One line of ``requests.jsonl``."""
    req = seq.request
    arrival = req.arrival_time * time_scale
    rec = {
        "id": req.id,
        "prompt_len": req.prompt_len,
        "max_tokens": req.max_tokens,
        "output_len": seq.num_output_tokens,
        "output_token_ids": list(seq.output_token_ids),
        "arrival_s": arrival,
        "priority": req.priority,
        "num_preemptions": seq.num_preemptions,
        "num_cached_prompt_tokens": seq.num_cached_prompt_tokens,
        "finish_reason": seq.finish_reason,
        "rejected_reason": seq.rejected_reason,
        "ttft_ms": None, "tpot_ms": None, "e2e_ms": None, "queue_ms": None, "itl_ms": [],
        "met_slo": None,
    }
    if seq.token_times:
        first, last = seq.token_times[0], seq.token_times[-1]
        rec["ttft_ms"] = (first - arrival) * 1e3
        rec["e2e_ms"] = (last - arrival) * 1e3
        n = seq.num_output_tokens
        rec["tpot_ms"] = (last - first) * 1e3 / (n - 1) if n > 1 else 0.0
        # to the microsecond: JSON writes a 3-decimal float ~5x faster than a full 17-digit one, and
        # a simulated trace writes millions of them
        rec["itl_ms"] = np.round(np.diff(seq.token_times) * 1e3, 3).tolist()
    if seq.first_scheduled_time is not None:
        rec["queue_ms"] = (seq.first_scheduled_time - arrival) * 1e3
    ttft_target = req.ttft_slo_ms if req.ttft_slo_ms is not None else ttft_slo_ms
    tpot_target = req.tpot_slo_ms if req.tpot_slo_ms is not None else tpot_slo_ms
    if seq.status == Status.FINISHED:
        rec["met_ttft_slo"] = ttft_target is None or rec["ttft_ms"] <= ttft_target
        rec["met_tpot_slo"] = tpot_target is None or rec["tpot_ms"] <= tpot_target
    else:
        rec["met_ttft_slo"] = rec["met_tpot_slo"] = False
    rec["met_slo"] = rec["met_ttft_slo"] and rec["met_tpot_slo"]
    return rec


def stats(values: Iterable[float]) -> dict[str, float | None]:
    arr = (np.frombuffer(values, dtype=float) if isinstance(values, array)
           else np.asarray([v for v in values if v is not None], dtype=float))
    if arr.size == 0:
        return {"mean": None, "p50": None, "p90": None, "p99": None}
    p50, p90, p99 = np.percentile(arr, [50, 90, 99])
    return {"mean": float(arr.mean()), "p50": float(p50), "p90": float(p90), "p99": float(p99)}


class RequestStats:
    """Folds request records (``requests.jsonl`` lines) into what the summary needs, so a run can
    write each record as its request ends and keep only numbers (memory stays flat in the number
    of requests)."""

    def __init__(self) -> None:
        self.num_requests = self.num_finished = self.num_rejected = 0
        self.output_tokens = self.prompt_tokens = self.cached_prompt_tokens = 0
        self.met = self.met_ttft = self.met_tpot = 0
        self.ttft, self.tpot, self.e2e, self.queue, self.itl = (array("d") for _ in range(5))

    def add(self, rec: dict) -> None:
        self.num_requests += 1
        self.output_tokens += rec["output_len"]
        if rec["rejected_reason"] is not None:
            self.num_rejected += 1
            return
        self.prompt_tokens += rec["prompt_len"]
        self.cached_prompt_tokens += rec["num_cached_prompt_tokens"]
        if rec["finish_reason"] is None:
            return
        self.num_finished += 1
        self.met += bool(rec["met_slo"])
        self.met_ttft += bool(rec["met_ttft_slo"])
        self.met_tpot += bool(rec["met_tpot_slo"])
        for values, key in ((self.ttft, "ttft_ms"), (self.e2e, "e2e_ms"), (self.queue, "queue_ms")):
            if rec[key] is not None:
                values.append(rec[key])
        if rec["output_len"] > 1 and rec["tpot_ms"] is not None:
            self.tpot.append(rec["tpot_ms"])
        self.itl.extend(rec["itl_ms"])

    @classmethod
    def of(cls, records) -> "RequestStats":
        stats = cls()
        for rec in records:
            stats.add(rec)
        return stats


def summarize(requests: RequestStats, totals: StepTotals, duration_s: float, leaked_blocks: int,
              extra: dict | None = None) -> dict:
    """``summary.json``: throughput, latency percentiles, SLO attainment, KV use, preemptions."""
    r = requests
    duration = max(duration_s, 1e-9)
    preemptions = dict(totals.preemptions)
    n_considered = r.num_requests - r.num_rejected
    summary = {
        "num_requests": r.num_requests,
        "num_finished": r.num_finished,
        "num_rejected": r.num_rejected,
        "num_unfinished": r.num_requests - r.num_finished - r.num_rejected,
        "duration_s": duration_s,
        "num_steps": totals.num_steps,
        "output_tokens": r.output_tokens,
        "prompt_tokens": r.prompt_tokens,
        "output_throughput_tok_s": r.output_tokens / duration,
        "request_throughput_req_s": r.num_finished / duration,
        "ttft_ms": stats(r.ttft),
        "tpot_ms": stats(r.tpot),
        "itl_ms": stats(r.itl),
        "e2e_ms": stats(r.e2e),
        "queue_ms": stats(r.queue),
        "slo_attainment": r.met / n_considered if n_considered else None,
        "ttft_slo_attainment": r.met_ttft / n_considered if n_considered else None,
        "tpot_slo_attainment": r.met_tpot / n_considered if n_considered else None,
        "goodput_req_s": r.met / duration,
        "num_preemptions": sum(preemptions.values()),
        "num_preemptions_by_kind": preemptions,
        "kv_utilization_mean": totals.kv_utilization_mean,
        "kv_utilization_max": totals.kv_utilization_max,
        "leaked_blocks": leaked_blocks,
    }
    summary.update(extra or {})
    return summary
