"""A cluster job end to end: build the replicas, run the workload through the router, write the
result files (partial ones too, whatever happens), log the run. The one-engine form is
:func:`servelab.run.session.run_job`, which hands ``cluster.*`` configs here; what both write
is :mod:`servelab.run.results`."""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig

from servelab.cluster.cluster import Cluster
from servelab.cluster.figures import load_imbalance, replica_figures
from servelab.core.registry import Registry
from servelab.engine.step_totals import StepTotals
from servelab.run.block_size import workload_requests
from servelab.run.cluster_build import build_cluster
from servelab.run.fairness import config_weights
from servelab.run.loggers import make_logger
from servelab.run.metrics import summarize
from servelab.run.preflight import check_requests
from servelab.run.results import (RequestWriter, RunResult, drop_placeholder_tokens, kv_pool_metrics,
                                  run_and_write)
from servelab.run.stack import Stack, model_shape, run_arrivals
from servelab.workloads.arrivals import workload_concurrency
from servelab.workloads.text import checkpoint_text, text_decorator


def run_cluster_job(cfg: DictConfig, output_dir: Path, requests=None, banner: bool = False,
                    registry: Registry | None = None) -> RunResult:
    """Run ``cfg``'s workload (or ``requests``) on the cluster ``cfg.cluster`` describes, its plugins
    (the router too) from ``registry`` (default: the installed ones)."""
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    if requests is None:
        requests = workload_requests(cfg, model_shape(cfg))  # once, for every replica and block_size=auto
    cluster, stacks = build_cluster(cfg, requests, registry)
    try:
        return _run(cfg, output_dir, requests, cluster, stacks, banner)
    finally:
        for stack in stacks:
            stack.executor.shutdown()


def _run(cfg: DictConfig, output_dir: Path, requests, cluster: Cluster, stacks: list[Stack], banner: bool):
    first = cluster.replicas[0].engine
    weights = config_weights(cfg)
    check_requests(cfg, first, requests)
    decorate = text_decorator(checkpoint_text(cfg)) if cfg.backend.name != "sim" else drop_placeholder_tokens
    logger = make_logger(cfg.logger)
    logger.start(cfg, output_dir)
    if banner:
        from servelab.run.banner import print_banner  # noqa: PLC0415 - rich

        print_banner(cfg, stacks[0], output_dir, logger.where(), cluster=cluster)
    answering = (cluster.decode or cluster.mixed)[0].engine  # its limits carry the run's SLO targets
    writer = RequestWriter(output_dir / "requests.jsonl", answering, cfg.workload.time_scale, decorate=decorate,
                           live=cluster.live_sequences)
    writer.record_listeners.append(logger.log_request)
    cluster.request_listeners.append(writer.on_end)
    for r in cluster.replicas:
        r.engine.keep_steps = bool(cfg.debug.log_steps)
        r.engine.forget_ended = True
    return run_and_write(
        cfg, output_dir, writer, logger, len(requests),
        lambda on_progress: cluster.run(run_arrivals(cfg, requests), on_progress=on_progress),
        lambda status: collect_cluster_results(cfg, cluster, stacks, status, writer, weights))


def collect_cluster_results(cfg: DictConfig, cluster: Cluster, stacks: list[Stack], status: str,
                            writer: RequestWriter, weights) -> RunResult:
    """``summary.json`` for the whole cluster (today's keys, every replica folded in), plus
    ``per_replica``, the router, and the KV transfers."""
    writer.close()
    engines = [r.engine for r in cluster.replicas]
    totals = StepTotals.merged(e.totals for e in engines)
    requests = writer.stats
    live = bool(cluster.live_sequences())
    leaked = None if live else sum(e.allocator.leaked_blocks() for e in engines)
    duration = totals.last_time_s
    per_replica = [replica_figures(r, duration) for r in cluster.replicas]
    pools = [kv_pool_metrics(e.executor) for e in engines]
    bytes_per_block = engines[0].executor.bytes_per_block
    summary = summarize(requests, totals, duration, leaked, {
        "status": status,
        "concurrency": workload_concurrency(cfg.workload),
        "prefix_cache_hit_rate": (requests.cached_prompt_tokens / requests.prompt_tokens
                                  if requests.prompt_tokens else 0.0),
        "prefill_tokens_computed": totals.prefill_tokens,
        "max_concurrent_requests": totals.max_concurrent,
        "kv_waste_fraction": totals.gauge_mean("kv_waste_fraction"),
        "swap_out_bytes": sum(e.totals.swap_out_blocks * e.executor.bytes_per_block for e in engines),
        "swap_in_bytes": sum(e.totals.swap_in_blocks * e.executor.bytes_per_block for e in engines),
        "recomputed_tokens": totals.recomputed_tokens,
        "bytes_per_block": bytes_per_block,
        "swap_bandwidth_gb_s": (engines[0].cost_model.swap_bytes_per_s or 0.0) / 1e9,
        **{f"{k}_mean": totals.gauge_mean(k) for k in sorted(set(totals.gauge_sums) - {"kv_waste_fraction"})},
        "num_kv_blocks": sum(e.allocator.num_blocks for e in engines),
        "kv_pool_blocks": sum(p["kv_pool_blocks"] for p in pools),
        "kv_pool_bytes": sum(p["kv_pool_bytes"] for p in pools),
        "num_swap_blocks": sum(e.executor.num_swap_blocks for e in engines),
        "block_size": engines[0].limits.block_size,
        "cost_model": engines[0].cost_model.coefficients,
        "model_time_s": totals.model_s,
        "comm_time_s": totals.comm_s,
        "tensor_parallel_size": cfg.tensor_parallel_size,
        **cluster_time(stacks),
        **stacks[0].executor.summary(),  # replica 0's ranks
        **({"block_size_auto": stacks[0].block_size_auto} if stacks[0].block_size_auto else {}),
        "router": cfg.router.name,
        "num_replicas": len(cluster.replicas),
        "num_gpus": sum(r.tensor_parallel_size for r in cluster.replicas),
        "load_imbalance": load_imbalance(per_replica),
        "num_kv_transfers": cluster.num_kv_transfers,
        "kv_transfer_bytes": cluster.kv_transfer_bytes,
        "kv_transfer_s": cluster.kv_transfer_s,
        "kv_transfer_exposed_s": cluster.kv_transfer_exposed_s,
        "per_replica": per_replica,
    }, weights)
    return RunResult(None, summary, [s for e in engines for s in e.steps], writer.path)


GRAPH_COUNTS = ("cuda_graph_steps", "cuda_graph_tokens", "cuda_graph_padding_tokens")


def cluster_time(stacks: list[Stack]) -> dict:
    """Replica 0's clock, time model and hardware, with the CUDA-graph counters summed over every
    replica (each prices its own steps) and the padding share of them all."""
    described = stacks[0].describe_time()
    if "cuda_graph_steps" not in described:
        return described
    parts = [stack.describe_time() for stack in stacks]
    for key in GRAPH_COUNTS:
        described[key] = sum(part[key] for part in parts)
    padded = described["cuda_graph_tokens"] + described["cuda_graph_padding_tokens"]
    described["cuda_graph_padding_share"] = described["cuda_graph_padding_tokens"] / padded if padded else 0.0
    return described
