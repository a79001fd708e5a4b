"""One job end to end: build the stack, run the workload, write the result files, log the run.

Partial results are written whatever happens (an error, Ctrl-C), and the logger is finished.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict
from pathlib import Path
from typing import Callable

from omegaconf import DictConfig, OmegaConf
from tqdm.auto import tqdm

from servelab.cluster.figures import replica_figures
from servelab.cluster.replica import Replica
from servelab.engine.engine import Engine, StepRecord
from servelab.run.fairness import DEFAULT_WEIGHTS, config_weights
from servelab.run.loggers import make_logger
from servelab.run.metrics import RequestStats, request_record, summarize
from servelab.run.preflight import check_requests
from servelab.core.request import Request
from servelab.run.runner import run_workload
from servelab.run.block_size import workload_requests
from servelab.run.cluster_build import is_cluster
from servelab.run.stack import Stack, build_stack, model_shape, validate
from servelab.workloads.text import checkpoint_text, text_decorator
from servelab.workloads.build import build_requests

log = logging.getLogger(__name__)


class RunResult:
    """What a run produced: one dict per request (``requests.jsonl``), the summary, the steps.

    A run written as it went (``run_job``) reads its request records back from
    ``requests.jsonl`` on first use of :attr:`requests`, so a long run never holds them all.
    """

    def __init__(self, requests: list[dict] | None, summary: dict, steps: list[StepRecord] | None = None,
                 requests_path: Path | None = None) -> None:
        self._requests = requests
        self.summary = summary
        self.steps = steps if steps is not None else []
        self.requests_path = requests_path

    @property
    def requests(self) -> list[dict]:
        if self._requests is None:
            self._requests = list(self.iter_requests())
        return self._requests

    def iter_requests(self):
        """The records one at a time (from the file when the run streamed them)."""
        if self._requests is not None:
            yield from self._requests
        elif self.requests_path is not None:
            with self.requests_path.open() as fh:
                for line in fh:
                    yield json.loads(line)

    def by_id(self) -> dict[str, dict]:
        return {r["id"]: r for r in self.requests}

    def write(self, output_dir: str | Path, log_steps: bool = False) -> None:
        """Write ``requests.jsonl`` (unless already streamed there), ``summary.json`` and (if
        ``log_steps``) ``steps.jsonl``."""
        out = Path(output_dir)
        out.mkdir(parents=True, exist_ok=True)
        target = out / "requests.jsonl"
        if self.requests_path is None or self.requests_path.resolve() != target.resolve():
            with target.open("w") as fh:
                for rec in self.iter_requests():
                    fh.write(json.dumps(rec) + "\n")
        (out / "summary.json").write_text(json.dumps(self.summary, indent=2) + "\n")
        if log_steps:
            with (out / "steps.jsonl").open("w") as fh:
                for s in self.steps:
                    fh.write(json.dumps(asdict(s)) + "\n")


class RequestWriter:
    """Writes each request's record to ``requests.jsonl`` as it ends and keeps only its numbers
    (:class:`RequestStats`); attach with ``engine.end_listeners`` and ``engine.forget_ended``."""

    def __init__(self, path: Path, engine: Engine, time_scale: float, decorate=None, live=None) -> None:
        self.path, self.engine, self.time_scale, self.decorate = path, engine, time_scale, decorate
        self.live = live  # () -> the sequences not yet ended (default: the engine's); a cluster has its own
        self.stats = RequestStats()
        self.record_listeners: list = []  # told of each record as it is written (the logger's table)
        self._fh = path.open("w")

    def on_end(self, seq) -> None:
        self._write(seq)

    def _write(self, seq) -> None:
        limits = self.engine.limits
        rec = request_record(seq, self.time_scale, limits.ttft_slo_ms, limits.tpot_slo_ms)
        if self.decorate is not None:
            self.decorate(rec, seq)
        self.stats.add(rec, seq)
        for listener in self.record_listeners:
            listener(rec)
        self._fh.write(json.dumps(rec) + "\n")

    def close(self) -> None:
        """Write the sequences that have not ended (an interrupted run) and close the file."""
        live = self.live() if self.live is not None else self.engine.sequences.values()
        for seq in list(live):
            if not seq.is_finished:
                self._write(seq)
        self._fh.close()


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
        "num_kv_blocks": engine.allocator.num_blocks,
        **kv_pool_metrics(engine.executor),
        "num_swap_blocks": getattr(engine.executor, "num_swap_blocks", 0),
        "block_size": limits.block_size,
        "cost_model": engine.cost_model.coefficients,
        "model_time_s": totals.model_s,
        "comm_time_s": totals.comm_s,
        **(extra or {}),
    }, fairness_weights)
    return RunResult(records, summary, engine.steps, writer.path if writer else None)


def kv_pool_metrics(executor) -> dict:
    """The KV pool of one rank: its blocks, and its bytes (quantised values and their scales included)."""
    blocks = getattr(executor, "num_kv_blocks", 0)
    return {"kv_pool_blocks": blocks, "kv_pool_bytes": blocks * getattr(executor, "bytes_per_block", 0)}


def _memory_metrics(engine: Engine) -> dict:
    """Swap traffic, KV discarded by recompute preemptions, and the allocator's other gauges (means)."""
    bytes_per_block = getattr(engine.executor, "bytes_per_block", 0)
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
    workload's requests are built once, before the stack, for the choice and the run.
    """
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    if stack is None and is_cluster(cfg):
        from servelab.run.cluster_run import run_cluster_job  # noqa: PLC0415 - it builds on this module

        return run_cluster_job(cfg, output_dir, requests, banner)
    if stack is not None:
        return _run_on_stack(cfg, output_dir, requests, stack, banner)
    if requests is None and cfg.block_size == "auto":  # built once: block_size=auto reads them, the run replays them
        validate(cfg)  # a missing key is named before the workload trips on it
        requests = workload_requests(cfg, model_shape(cfg))
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
    decorate = text_decorator(text) if cfg.backend.name != "sim" else _drop_placeholder_tokens
    logger = make_logger(cfg.logger)
    logger.start(cfg, output_dir)
    if banner:
        from servelab.run.banner import print_banner  # noqa: PLC0415 - rich

        print_banner(cfg, stack, output_dir, logger.where())
    logger.attach(engine)  # logger=none reads no steps
    writer = RequestWriter(output_dir / "requests.jsonl", engine, cfg.workload.time_scale,
                           decorate=decorate)
    writer.record_listeners.append(logger.log_request)
    engine.end_listeners.append(writer.on_end)
    engine.forget_ended = True  # each ended request is on disk: memory holds only live ones

    def collect(status: str) -> RunResult:  # after the run: the executor's and time model's figures are final
        return collect_results(engine, cfg.workload.time_scale, status,
                               {"tensor_parallel_size": cfg.tensor_parallel_size, **stack.describe_time(),
                                **({"block_size_auto": stack.block_size_auto} if stack.block_size_auto else {}),
                                **(stack.executor.summary() if hasattr(stack.executor, "summary") else {}),
                                "per_replica": [single_replica_figures(stack, cfg, writer.stats)]},
                               writer=writer, fairness_weights=weights)

    return run_and_write(
        cfg, output_dir, writer, logger, len(requests),
        lambda on_progress: run_workload(engine, requests, cfg.workload.time_scale, on_progress=on_progress),
        collect)


def run_and_write(cfg: DictConfig, output_dir: Path, writer: RequestWriter, logger, num_requests: int,
                  run: Callable[[Callable[[int], None] | None], None],
                  collect: Callable[[str], RunResult]) -> RunResult:
    """``run(on_progress)`` the workload, then, however it ended, ``collect(status)`` its results and
    write them (partial ones too): the result files, ``config.yaml``, the logger's finish with the
    exit code (0 completed, 2 every request rejected, 130 interrupted, 1 an error, which goes on)."""
    status, exit_code = "completed", 0
    progress = _progress_bar(num_requests, cfg.get("progress", True))
    try:
        run(progress.update if progress else None)
        if writer.stats.num_requests and writer.stats.num_rejected == writer.stats.num_requests:
            status, exit_code = "failed: every request was rejected", 2
    except KeyboardInterrupt:
        status, exit_code = "interrupted", 130
        raise
    except BaseException as exc:
        status, exit_code = f"failed: {type(exc).__name__}: {exc}", 1
        raise
    finally:
        if progress:
            progress.close()
        result = collect(status)
        result.write(output_dir, cfg.debug.log_steps)
        OmegaConf.save(cfg, output_dir / "config.yaml", resolve=True)
        logger.finish(result.summary, result.iter_requests(), exit_code)
        if exit_code == 1:  # an error; the command line reports an interrupt or all-rejected run itself
            log.error("run %s; partial results written to %s", status, output_dir)
    return result


def _drop_placeholder_tokens(rec: dict, seq) -> None:
    """The simulator's records say ``output_token_ids: null``: its tokens are placeholders (``output_len``
    counts them), and encoding hundreds of zeros per request only costs a long simulated run time."""
    rec["output_token_ids"] = None


def _progress_bar(total: int, enabled: bool):
    if not enabled:
        return None
    return tqdm(total=total, desc="requests", unit="req", dynamic_ncols=True, leave=False)


def single_replica_figures(stack: Stack, cfg: DictConfig, stats: RequestStats) -> dict:
    """``per_replica`` of a one-engine run: the engine as replica 0, serving every request."""
    replica = Replica(0, "mixed", stack.engine, cfg.tensor_parallel_size,
                      cfg.hardware.name if stack.clock_kind == "virtual" else "this machine")
    replica.placed, replica.prompt_tokens = stats.num_requests, stats.prompt_tokens
    replica.cached_prompt_tokens, replica.output_tokens = stats.cached_prompt_tokens, stats.output_tokens
    return replica_figures(replica, stack.engine.totals.last_time_s)
