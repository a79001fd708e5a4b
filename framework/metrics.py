"""Per-request results and the run summary (definitions follow vLLM's benchmark and Sarathi/Vidur).

TTFT = first token - arrival; TPOT = (e2e - TTFT) / (output tokens - 1); ITL = gaps between
consecutive tokens; queueing delay = first scheduled - arrival; goodput = requests meeting every
SLO per second.
"""

from __future__ import annotations

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
        rec["itl_ms"] = (np.diff(seq.token_times) * 1e3).tolist()
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
    arr = np.asarray([v for v in values if v is not None], dtype=float)
    if arr.size == 0:
        return {"mean": None, "p50": None, "p90": None, "p99": None}
    p50, p90, p99 = np.percentile(arr, [50, 90, 99])
    return {"mean": float(arr.mean()), "p50": float(p50), "p90": float(p90), "p99": float(p99)}


def summarize(records: list[dict], totals: StepTotals, duration_s: float, leaked_blocks: int,
              extra: dict | None = None) -> dict:
    """``summary.json``: throughput, latency percentiles, SLO attainment, KV use, preemptions."""
    finished = [r for r in records if r["finish_reason"] is not None]
    rejected = [r for r in records if r["rejected_reason"] is not None]
    output_tokens = sum(r["output_len"] for r in records)
    duration = max(duration_s, 1e-9)
    preemptions = dict(totals.preemptions)
    met = [r for r in finished if r["met_slo"]]
    n_considered = len(records) - len(rejected)
    summary = {
        "num_requests": len(records),
        "num_finished": len(finished),
        "num_rejected": len(rejected),
        "num_unfinished": len(records) - len(finished) - len(rejected),
        "duration_s": duration_s,
        "num_steps": totals.num_steps,
        "output_tokens": output_tokens,
        "prompt_tokens": sum(r["prompt_len"] for r in records if r["rejected_reason"] is None),
        "output_throughput_tok_s": output_tokens / duration,
        "request_throughput_req_s": len(finished) / duration,
        "ttft_ms": stats(r["ttft_ms"] for r in finished),
        "tpot_ms": stats(r["tpot_ms"] for r in finished if r["output_len"] > 1),
        "itl_ms": stats(x for r in finished for x in r["itl_ms"]),
        "e2e_ms": stats(r["e2e_ms"] for r in finished),
        "queue_ms": stats(r["queue_ms"] for r in finished),
        "slo_attainment": len(met) / n_considered if n_considered else None,
        "ttft_slo_attainment": (sum(r["met_ttft_slo"] for r in finished) / n_considered) if n_considered else None,
        "tpot_slo_attainment": (sum(r["met_tpot_slo"] for r in finished) / n_considered) if n_considered else None,
        "goodput_req_s": len(met) / duration,
        "num_preemptions": sum(preemptions.values()),
        "num_preemptions_by_kind": preemptions,
        "kv_utilization_mean": totals.kv_utilization_mean,
        "kv_utilization_max": totals.kv_utilization_max,
        "leaked_blocks": leaked_blocks,
    }
    summary.update(extra or {})
    return summary
