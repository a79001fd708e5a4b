"""``summary.json`` of a cluster, made from per-replica data only (:class:`ReplicaReport` and the
router's counts), so the simulator's cluster (:mod:`servelab.run.cluster_run`) and the wall-clock
cluster of engine processes (:mod:`servelab.cluster.procs.cluster`) write the same keys."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from omegaconf import DictConfig

from servelab.results.cluster_figures import ReplicaCounts, load_imbalance, replica_figures
from servelab.engine.step_totals import StepTotals
from servelab.kv.tiers.cluster_figures import cluster_tier_figures, replica_tier_hit_rate
from servelab.results.metrics import summarize
from servelab.results.migration_figures import MigrationSums
from servelab.results.replica_report import ReplicaReport
from servelab.results.writer import RequestWriter, RunResult
from servelab.workloads.arrivals import workload_concurrency


@dataclass
class KVTransferSums:
    """The prefill->decode KV transfers of a run, summed (zero for colocated replicas)."""

    num_kv_transfers: int = 0
    kv_transfer_bytes: float = 0.0
    kv_transfer_s: float = 0.0
    kv_transfer_exposed_s: float = 0.0


def cluster_summary(cfg: DictConfig, replicas: Sequence[ReplicaCounts], reports: list[ReplicaReport],
                    kv: KVTransferSums, status: str, writer: RequestWriter, weights,
                    migrations: MigrationSums | None = None) -> RunResult:
    """``summary.json`` for the whole cluster (today's keys, every replica folded in), plus
    ``per_replica``, the router, and the KV transfers; from per-replica data only, so the simulator's
    cluster and the wall-clock cluster of processes write the same keys. ``writer``: closed.
    ``migrations``: the live migrations of a cluster whose migration policy moves requests (their
    keys are written only then: a run with ``migration_policy=none`` writes today's summary)."""
    totals = StepTotals.merged(p.totals for p in reports)
    requests = writer.stats
    leaks = [p.leaked_blocks for p in reports]
    leaked = None if any(n is None for n in leaks) else sum(n for n in leaks if n is not None)
    duration = totals.last_time_s
    per_replica = [{**replica_figures(r, duration, p.totals, p.num_kv_blocks), **replica_tier_hit_rate(p.kv_tiers)}
                   for r, p in zip(replicas, reports)]
    first = reports[0]
    summary = summarize(requests, totals, duration, leaked, {
        "status": status,
        "concurrency": workload_concurrency(cfg.workload),
        "prefix_cache_hit_rate": (requests.cached_prompt_tokens / requests.prompt_tokens
                                  if requests.prompt_tokens else 0.0),
        "prefill_tokens_computed": totals.prefill_tokens,
        "max_concurrent_requests": totals.max_concurrent,
        "kv_waste_fraction": totals.gauge_mean("kv_waste_fraction"),
        "swap_out_bytes": sum(p.totals.swap_out_blocks * p.bytes_per_block for p in reports),
        "swap_in_bytes": sum(p.totals.swap_in_blocks * p.bytes_per_block for p in reports),
        "recomputed_tokens": totals.recomputed_tokens,
        "bytes_per_block": first.bytes_per_block,
        "swap_bandwidth_gb_s": first.swap_bytes_per_s / 1e9,
        **{f"{k}_mean": totals.gauge_mean(k) for k in sorted(set(totals.gauge_sums) - {"kv_waste_fraction"})},
        "num_kv_blocks": sum(p.num_kv_blocks for p in reports),
        "kv_pool_blocks": sum(p.kv_pool_blocks for p in reports),
        "kv_pool_bytes": sum(p.kv_pool_bytes for p in reports),
        "num_swap_blocks": sum(p.num_swap_blocks for p in reports),
        "block_size": first.block_size,
        "cost_model": first.cost_model,
        "model_time_s": totals.model_s,
        "comm_time_s": totals.comm_s,
        "tensor_parallel_size": cfg.tensor_parallel_size,
        "expert_parallel_size": cfg.get("expert_parallel_size", 1),
        "pipeline_parallel_size": cfg.get("pipeline_parallel_size", 1),
        **cluster_time(reports),
        **first.executor_summary,  # replica 0's ranks
        **({"block_size_auto": first.block_size_auto} if first.block_size_auto else {}),
        "router": cfg.router.name,
        "num_replicas": len(replicas),
        "num_gpus": sum(r.tensor_parallel_size for r in replicas),
        "load_imbalance": load_imbalance(per_replica),
        "num_kv_transfers": kv.num_kv_transfers,
        "kv_transfer_bytes": kv.kv_transfer_bytes,
        "kv_transfer_s": kv.kv_transfer_s,
        "kv_transfer_exposed_s": kv.kv_transfer_exposed_s,
        "per_replica": per_replica,
    }, weights)
    tiers = cluster_tier_figures([p.kv_tiers for p in reports], summary.get("num_finished") or 0,
                                 summary.get("ttft_ms") or {}, summary.get("queue_ms") or {})
    summary.update(tiers)
    if migrations is not None:
        summary.update({"migration_policy": cfg.migration_policy.name, **migrations.figures()})
    return RunResult(None, summary, [s for p in reports for s in p.steps], writer.path, [p.timeline for p in reports])


GRAPH_COUNTS = ("cuda_graph_steps", "cuda_graph_tokens", "cuda_graph_padding_tokens")


def cluster_time(reports: list[ReplicaReport]) -> dict:
    """Replica 0's clock, time model and hardware, with the CUDA-graph counters summed over every
    replica (each prices its own steps) and the padding share of them all."""
    described = dict(reports[0].time)
    if "cuda_graph_steps" not in described:
        return described
    parts = [p.time for p in reports]
    for key in GRAPH_COUNTS:
        described[key] = sum(part.get(key, 0) for part in parts)
    padded = described["cuda_graph_tokens"] + described["cuda_graph_padding_tokens"]
    described["cuda_graph_padding_share"] = described["cuda_graph_padding_tokens"] / padded if padded else 0.0
    return described
