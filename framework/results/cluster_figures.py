"""What ``summary.json`` says about each replica of a cluster: one entry of ``per_replica`` per
replica (the replicas' step totals are folded into one by :meth:`StepTotals.merged
<servelab.engine.step_totals.StepTotals.merged>`)."""

from __future__ import annotations

from typing import Protocol

from servelab.engine.step_totals import StepTotals


class ReplicaCounts(Protocol):
    """What ``per_replica`` reads of a replica beside its steps: a :class:`~servelab.cluster.replica.Replica`
    (the simulator's) or the wall-clock cluster's record of an engine process."""

    index: int
    role: str
    tensor_parallel_size: int
    hardware: str
    placed: int
    prompt_tokens: int
    cached_prompt_tokens: int
    output_tokens: int


def replica_figures(r: ReplicaCounts, duration_s: float, totals: StepTotals, num_kv_blocks: int) -> dict:
    """One entry of ``per_replica``: the replica's role and size, what was placed on it, what it
    computed (prompt tokens it prefilled or received, output tokens it generated) and how busy
    its pool was (``totals``: its steps; ``num_kv_blocks``: its pool). Throughputs are over the
    whole run's duration, so they add up to the cluster's."""
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
        "num_kv_blocks": num_kv_blocks,
        "num_steps": totals.num_steps,
        "busy_fraction": totals.busy_s / duration,
        "num_preemptions": totals.num_preemptions,
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
