"""One job end to end: build the stack, run the workload, write the result files, log the run.

Partial results are written whatever happens (an error, Ctrl-C), and the logger is finished.
"""

from __future__ import annotations

import logging
from pathlib import Path

from omegaconf import DictConfig

from servelab.results.cluster_figures import replica_figures
from servelab.cluster.replica import Replica
from servelab.engine.engine import Engine
from servelab.results.fairness import DEFAULT_WEIGHTS, config_weights
from servelab.results.loggers import make_logger
from servelab.results.metrics import RequestStats, request_record, summarize
from servelab.assemble.preflight import check_requests
from servelab.core.errors import WorkloadError
from servelab.core.request import Request
from servelab.run.runner import run_workload
from servelab.assemble.block_size import workload_requests
from servelab.cluster.build import is_cluster
from servelab.run.cluster_run import run_cluster_job
# RunResult and RequestWriter: also importable from here, as before
from servelab.results.writer import (RequestWriter, RunResult, drop_placeholder_tokens, kv_pool_metrics, requests_format,
                                  run_and_write)
from servelab.kv.tiers.build import default_disk_dir
from servelab.assemble.executor import model_shape
from servelab.assemble.stack import Stack, build_stack, run_arrivals
from servelab.assemble.validate import validate
from servelab.kv.tiers.figures import kv_tier_figures, ttft_split
from servelab.workloads.text import checkpoint_text, text_decorator
from servelab.workloads.arrivals import workload_concurrency
from servelab.workloads.build import build_requests

log = logging.getLogger(__name__)


def collect_results(engine: Engine, time_scale: float, status: str = "completed", extra: dict | None = None,
                    writer: RequestWriter | None = None,
                    fairness_weights: tuple[float, float] = DEFAULT_WEIGHTS) -> RunResult:
    """Turn the engine's sequences and steps into a :class:`RunResult` (partial runs included);
    with ``writer``, the records are the ones it streamed to its file. ``fairness_weights``:
    ``(fairness.input_weight, fairness.output_weight)``."""
    limits = engine.limits
    if writer is None:
        seqs = list(engine.sequences.values())
        records = [request_record(s, time_scale, limits.ttft_slo_ms, limits.tpot_slo_ms) for s in seqs]
        requests = RequestStats.of(records, seqs)
    else:
        writer.close()
        records, requests = None, writer.stats
    totals = engine.totals
    live = any(not s.is_finished for s in engine.sequences.values())
    leaked = engine.allocator.leaked_blocks() if not live else None
    summary = summarize(requests, totals, totals.last_time_s, leaked, {
        "status": status,
        "prefix_cache_hit_rate": (requests.cached_prompt_tokens / requests.prompt_tokens
                                  if requests.prompt_tokens else 0.0),
        "prefill_tokens_computed": totals.prefill_tokens,
        "max_concurrent_requests": totals.max_concurrent,
        "kv_waste_fraction": totals.gauge_mean("kv_waste_fraction"),
        **_memory_metrics(engine),
        **kv_tier_figures(engine.connector),
        "num_kv_blocks": engine.allocator.num_blocks,
        **kv_pool_metrics(engine.executor),
        "num_swap_blocks": engine.executor.num_swap_blocks,
        "block_size": limits.block_size,
        "cost_model": engine.cost_model.coefficients,
        "model_time_s": totals.model_s,
        "comm_time_s": totals.comm_s,
        **(extra or {}),
    }, fairness_weights)
    if "kv_tiers" in summary:
        summary["kv_tier_ttft_split_ms"] = ttft_split(summary, engine.connector)
    return RunResult(records, summary, engine.steps, writer.path if writer else None,
                     [engine.timeline.columns() if engine.timeline is not None else {}])


def _memory_metrics(engine: Engine) -> dict:
    """Swap traffic, KV discarded by recompute preemptions, and the allocator's other gauges (means)."""
    bytes_per_block = engine.executor.bytes_per_block
    totals = engine.totals
    gauges = sorted(set(totals.gauge_sums) - {"kv_waste_fraction"})
    return {
        "swap_out_bytes": totals.swap_out_blocks * bytes_per_block,
        "swap_in_bytes": totals.swap_in_blocks * bytes_per_block,
        # tokens whose KV a recompute preemption discarded (recomputed later, less prefix-cache hits)
        "recomputed_tokens": totals.recomputed_tokens,
        "bytes_per_block": bytes_per_block,
        "swap_bandwidth_gb_s": (engine.cost_model.swap_bytes_per_s or 0.0) / 1e9,
        **{f"{k}_mean": totals.gauge_mean(k) for k in gauges},
    }


def run_job(cfg: DictConfig, output_dir: str | Path, requests: list[Request] | None = None,
            stack: Stack | None = None, banner: bool = False) -> RunResult:
    """Run the workload of ``cfg`` (or ``requests``) and write the result files to ``output_dir``.

    Without ``stack`` the stack is built here and its executor shut down at the end (error or not);
    a given ``stack`` stays open (its owner shuts it down). ``banner``: print what runs and where
    its results go before the first step (the command line does). With ``block_size=auto`` the
    workload's requests are built once, before the stack, for the choice and the run. No requests
    (``requests=[]``, or a workload that makes none) is a :class:`WorkloadError`, before any result file is written.
    """
    if requests is not None and not len(requests):  # a run of nothing would report "completed", every figure n/a
        raise WorkloadError("run_job(requests=[]): no requests to run; give at least one Request (or requests=None "
                            "for the configured workload)")
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    if stack is None and is_cluster(cfg):
        return run_cluster_job(cfg, output_dir, requests, banner)
    if stack is not None:
        return _run_on_stack(cfg, output_dir, requests, stack, banner)
    if requests is None and cfg.block_size == "auto":  # built once: block_size=auto reads them, the run replays them
        validate(cfg)  # a missing key is named before the workload trips on it
        requests = workload_requests(cfg, model_shape(cfg))
    default_disk_dir(cfg, output_dir)
    stack = build_stack(cfg, requests=requests)
    try:
        return _run_on_stack(cfg, output_dir, requests, stack, banner)
    finally:
        stack.executor.shutdown()  # we built it, so we release its workers (TP processes), error or not


def _run_on_stack(cfg: DictConfig, output_dir: Path, requests: list[Request] | None, stack: Stack,
                  banner: bool = False) -> RunResult:
    engine = stack.engine
    engine.keep_steps = bool(cfg.debug.log_steps)  # long runs: the summary comes from engine.totals
    weights = config_weights(cfg)  # checked before the run, used at its end
    text = checkpoint_text(cfg)  # the checkpoint's tokenizer: text prompts in, output_text out
    if requests is None:
        requests = build_requests(cfg.workload, stack.executor.spec.vocab_size, stack.limits.max_model_len, text)
    check_requests(cfg, engine, requests)
    # loads the tokenizer (if any) before the run starts; the simulator's tokens are placeholders
    decorate = text_decorator(text) if cfg.backend.name != "sim" else drop_placeholder_tokens
    logger = make_logger(cfg.logger)
    logger.start(cfg, output_dir)
    if banner:
        from servelab.results.banner import print_banner  # noqa: PLC0415 - rich

        print_banner(cfg, stack, output_dir, logger.where())
    logger.attach(engine)  # logger=none reads no steps
    writer = RequestWriter(output_dir / "requests.jsonl", engine, cfg.workload.time_scale,
                           decorate=decorate, requests_format=requests_format(cfg))
    writer.record_listeners.append(logger.log_request)
    engine.end_listeners.append(writer.on_end)
    engine.forget_ended = True  # each ended request is on disk: memory holds only live ones

    def collect(status: str) -> RunResult:  # after the run: the executor's and time model's figures are final
        return collect_results(engine, cfg.workload.time_scale, status,
                               {"concurrency": workload_concurrency(cfg.workload),
                                "tensor_parallel_size": cfg.tensor_parallel_size,
                                "expert_parallel_size": cfg.get("expert_parallel_size", 1),
                                "pipeline_parallel_size": cfg.get("pipeline_parallel_size", 1), **stack.describe_time(),
                                **({"block_size_auto": stack.block_size_auto} if stack.block_size_auto else {}),
                                **stack.executor.summary(),
                                "per_replica": [single_replica_figures(stack, cfg, writer.stats)]},
                               writer=writer, fairness_weights=weights)

    try:
        return run_and_write(
            cfg, output_dir, writer, logger, len(requests),
            lambda on_progress: run_workload(engine, requests, cfg.workload.time_scale, on_progress=on_progress,
                                             arrivals=run_arrivals(cfg, requests)),
            collect)
    finally:  # a given stack outlives the run: its next run gets its own writer and logger
        engine.end_listeners.remove(writer.on_end)
        logger.detach(engine)


def single_replica_figures(stack: Stack, cfg: DictConfig, stats: RequestStats) -> dict:
    """``per_replica`` of a one-engine run: the engine as replica 0, serving every request."""
    replica = Replica(0, stack.engine, cfg.hardware.name if stack.clock_kind == "virtual" else "this machine",
                      tensor_parallel_size=cfg.tensor_parallel_size)
    replica.placed, replica.prompt_tokens = stats.num_requests, stats.prompt_tokens
    replica.cached_prompt_tokens, replica.output_tokens = stats.cached_prompt_tokens, stats.output_tokens
    return replica_figures(replica, stack.engine.totals.last_time_s, stack.engine.totals,
                           stack.engine.allocator.num_blocks)
