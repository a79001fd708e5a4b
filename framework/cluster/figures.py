"""What ``summary.json`` says about a cluster: the steps of every replica folded into one total,
and one entry of ``per_replica`` per replica."""

from __future__ import annotations

from servelab.cluster.replica import Replica
from servelab.engine.step_totals import StepTotals


def merge_totals(parts: list[StepTotals]) -> StepTotals:
    """The cluster's totals: counts and sums added, maxima and the last step's time the largest;
    ``kv_utilization_mean`` becomes the mean over every replica's steps, and ``max_concurrent`` the
    sum of each replica's peak (an upper bound on the cluster's: the peaks need not coincide)."""
    total = StepTotals()
    for t in parts:
        total.num_steps += t.num_steps
        total.last_time_s = max(total.last_time_s, t.last_time_s)
        total.kv_utilization_sum += t.kv_utilization_sum
        total.kv_utilization_max = max(total.kv_utilization_max, t.kv_utilization_max)
        for kind, n in t.preemptions.items():
            total.preemptions[kind] = total.preemptions.get(kind, 0) + n
        total.recomputed_tokens += t.recomputed_tokens
        total.prefill_tokens += t.prefill_tokens
        total.max_concurrent += t.max_concurrent
        total.swap_out_blocks += t.swap_out_blocks
        total.swap_in_blocks += t.swap_in_blocks
        total.model_s += t.model_s
        total.comm_s += t.comm_s
        total.busy_s += t.busy_s
        for k, v in t.gauge_sums.items():
            total.gauge_sums[k] = total.gauge_sums.get(k, 0.0) + v
            total.gauge_counts[k] = total.gauge_counts.get(k, 0) + t.gauge_counts[k]
    return total


def replica_figures(r: Replica, duration_s: float) -> dict:
    """One entry of ``per_replica``: the replica's role and size, what was placed on it, what it
    computed (prompt tokens it prefilled or received, output tokens it generated) and how busy
    its pool was. Throughputs are over the whole run's duration, so they add up to the cluster's."""
    totals = r.engine.totals
    duration = max(duration_s, 1e-9)
    return {
        "index": r.index,
        "role": r.role,
        "tensor_parallel_size": r.tensor_parallel_size,
        "hardware": r.hardware,
        "num_requests": r.placed,
        "prompt_tokens": r.prompt_tokens,
        "output_tokens": r.output_tokens,
        "output_throughput_tok_s": r.output_tokens / duration,
        "prompt_throughput_tok_s": r.prompt_tokens / duration,
        "prefix_cache_hit_rate": r.cached_prompt_tokens / r.prompt_tokens if r.prompt_tokens else 0.0,
        "kv_utilization_mean": totals.kv_utilization_mean,
        "kv_utilization_max": totals.kv_utilization_max,
        "num_kv_blocks": r.engine.allocator.num_blocks,
        "num_steps": totals.num_steps,
        "busy_fraction": totals.busy_s / duration,
        "num_preemptions": sum(totals.preemptions.values()),
    }


def load_imbalance(per_replica: list[dict], key: str = "num_requests") -> float:
    """max / mean of ``key`` over the replicas that share one role (1.0 = perfectly even); the
    largest such ratio over the roles present."""
    worst = 1.0
    for role in {p["role"] for p in per_replica}:
        values = [p[key] for p in per_replica if p["role"] == role]
        mean = sum(values) / len(values)
        if mean > 0:
            worst = max(worst, max(values) / mean)
    return worst
