"""One job end to end: build the stack, run the workload, write the result files, log the run.

Partial results are written whatever happens (an error, Ctrl-C), and the logger is finished.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass, field
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from .engine import Engine, StepRecord
from .loggers import make_logger
from .metrics import request_record, summarize
from .request import Request
from .runner import run_workload
from .stack import Stack, build_stack
from .workloads import build_requests

log = logging.getLogger(__name__)


@dataclass
class RunResult:
    """What a run produced: one dict per request (``requests.jsonl``), the summary, the steps."""

    requests: list[dict]
    summary: dict
    steps: list[StepRecord] = field(default_factory=list)

    def by_id(self) -> dict[str, dict]:
        return {r["id"]: r for r in self.requests}

    def write(self, output_dir: str | Path, log_steps: bool = False) -> None:
        """Write ``requests.jsonl``, ``summary.json`` and (if ``log_steps``) ``steps.jsonl``."""
        out = Path(output_dir)
        out.mkdir(parents=True, exist_ok=True)
        with (out / "requests.jsonl").open("w") as fh:
            for rec in self.requests:
                fh.write(json.dumps(rec) + "\n")
        (out / "summary.json").write_text(json.dumps(self.summary, indent=2) + "\n")
        if log_steps:
            with (out / "steps.jsonl").open("w") as fh:
                for s in self.steps:
                    fh.write(json.dumps(asdict(s)) + "\n")


def collect_results(engine: Engine, time_scale: float, status: str = "completed", extra: dict | None = None) -> RunResult:
    """Turn the engine's sequences and steps into a :class:`RunResult` (partial runs included)."""
    limits = engine.limits
    records = [request_record(s, time_scale, limits.ttft_slo_ms, limits.tpot_slo_ms) for s in engine.sequences.values()]
    totals = engine.totals
    duration = totals.last_time_s
    live = any(not s.is_finished for s in engine.sequences.values())
    leaked = engine.allocator.leaked_blocks() if not live else None
    cached = sum(r["num_cached_prompt_tokens"] for r in records)
    prompt = sum(r["prompt_len"] for r in records if r["rejected_reason"] is None)
    summary = summarize(records, totals, duration, leaked, {
        "status": status,
        "prefix_cache_hit_rate": cached / prompt if prompt else 0.0,
        "prefill_tokens_computed": totals.prefill_tokens,
        "max_concurrent_requests": totals.max_concurrent,
        "kv_waste_fraction": totals.gauge_mean("kv_waste_fraction"),
        **_memory_metrics(engine),
        "num_kv_blocks": engine.allocator.num_blocks,
        "block_size": limits.block_size,
        "cost_model": engine.cost_model.coefficients,
        "model_time_s": totals.model_s,
        "comm_time_s": totals.comm_s,
        **(extra or {}),
    })
    return RunResult(records, summary, engine.steps)


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
            stack: Stack | None = None) -> RunResult:
    """Run the workload of ``cfg`` (or ``requests``) and write the result files to ``output_dir``.

    Without ``stack`` the stack is built here and its executor shut down at the end (error or not);
    a given ``stack`` stays open (its owner shuts it down).
    """
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    if stack is not None:
        return _run_on_stack(cfg, output_dir, requests, stack)
    stack = build_stack(cfg)
    try:
        return _run_on_stack(cfg, output_dir, requests, stack)
    finally:
        stack.executor.shutdown()  # we built it, so we release its workers (TP processes), error or not


def _run_on_stack(cfg: DictConfig, output_dir: Path, requests: list[Request] | None, stack: Stack) -> RunResult:
    engine = stack.engine
    engine.keep_steps = bool(cfg.debug.log_steps)  # long runs: the summary comes from engine.totals
    if requests is None:
        requests = build_requests(cfg.workload, stack.executor.spec.vocab_size, stack.limits.max_model_len)
    logger = make_logger(cfg.logger)
    logger.start(cfg, output_dir)
    engine.step_listeners.append(logger.log_step)
    status, exit_code = "completed", 0
    progress = _progress_bar(len(requests), cfg.get("progress", True))
    try:
        run_workload(engine, requests, cfg.workload.time_scale, on_progress=progress.update if progress else None)
    except KeyboardInterrupt:
        status, exit_code = "interrupted", 130
        raise
    except BaseException as exc:
        status, exit_code = f"failed: {type(exc).__name__}: {exc}", 1
        raise
    finally:
        if progress:
            progress.close()
        result = collect_results(engine, cfg.workload.time_scale, status,
                                 {"tensor_parallel_size": cfg.tensor_parallel_size, **stack.describe_time(),
                                  **(stack.executor.summary() if hasattr(stack.executor, "summary") else {})})
        result.write(output_dir, cfg.debug.log_steps)
        OmegaConf.save(cfg, output_dir / "config.yaml", resolve=True)
        logger.finish(result.summary, result.requests, exit_code)
        if status != "completed":
            log.error("run %s; partial results written to %s", status, output_dir)
    return result


def _progress_bar(total: int, enabled: bool):
    if not enabled:
        return None
    from tqdm.auto import tqdm

    return tqdm(total=total, desc="requests", unit="req", dynamic_ncols=True, leave=False)
