"""Run loggers: Weights & Biases (offline by default) or none."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Iterable

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from servelab.engine.engine import StepRecord

log = logging.getLogger(__name__)


class RunLogger:
    """No-op base: ``start`` once, ``log_step`` per step, ``finish`` exactly once (even on error)."""

    def start(self, cfg: DictConfig, output_dir: Path) -> None:
        """Open the run with the resolved config."""

    def where(self) -> str:
        """Where the run's log goes (the start-up banner shows it)."""
        return "off (logger=none)"

    def log_step(self, record: StepRecord) -> None:
        """Record per-step series (batch size, tokens, KV utilisation, queue lengths)."""

    def finish(self, summary: dict, requests: list[dict], exit_code: int = 0) -> None:
        """Record the summary and the requests table, and close the run."""


class WandbLogger(RunLogger):
    """One W&B run per job, in ``<output_dir>/wandb``; ``logger.mode`` decides offline/online."""

    def __init__(self, cfg: DictConfig) -> None:
        self.cfg = cfg
        self.run = None

    def start(self, cfg: DictConfig, output_dir: Path) -> None:
        import wandb  # noqa: PLC0415 - wandb

        lc = self.cfg
        self.run = wandb.init(
            project=lc.project, entity=lc.entity, group=lc.group or sweep_group(), tags=list(lc.tags), mode=lc.mode,
            dir=str(output_dir), config=OmegaConf.to_container(cfg, resolve=True, enum_to_str=True),
            name=output_dir.name, settings=wandb.Settings(silent=True, console="off", x_disable_stats=True),
        )

    def where(self) -> str:
        if self.run is None:
            return "not started"
        if self.cfg.mode == "online":
            return f"online, {self.run.url}"
        return f"{self.cfg.mode}, {Path(self.run.dir).parent} (wandb sync uploads it)"

    def log_step(self, record: StepRecord) -> None:
        if self.run is None or not _should_log(record.step, self.cfg.get("step_interval")):
            return
        data = {"step/num_seqs": record.num_seqs, "step/num_tokens": record.num_tokens,
                "step/prefill_tokens": record.prefill_tokens, "step/decode_seqs": record.decode_seqs,
                "step/duration_ms": record.duration_s * 1e3, "step/model_ms": record.model_s * 1e3,
                "step/comm_ms": record.comm_s * 1e3, "step/kv_utilization": record.kv_utilization,
                "step/num_preempted": len(record.preempted), "time_s": record.time_s}
        if record.draft_tokens:
            data.update({"step/draft_tokens": record.draft_tokens, "step/accepted_tokens": record.accepted_tokens})
        data.update({f"queue/{k}": v for k, v in record.queues.items()})
        self.run.log(data, step=record.step)

    def finish(self, summary: dict, requests: Iterable[dict], exit_code: int = 0) -> None:
        if self.run is None:
            return
        import wandb  # noqa: PLC0415 - wandb

        try:
            self.run.summary.update(_flatten(summary))
            if self.cfg.log_requests_table:
                cols = ["id", "prompt_len", "output_len", "arrival_s", "ttft_ms", "tpot_ms", "e2e_ms", "queue_ms",
                        "num_preemptions", "finish_reason", "rejected_reason", "met_slo"]
                rows, text_cols = [], None
                for r in requests:  # any iterable of records
                    if text_cols is None:  # checkpoints with a tokenizer: the text too
                        text_cols = [c for c in ("prompt_text", "output_text") if c in r]
                    rows.append([r.get(c) for c in cols + text_cols])
                if rows:
                    self.run.log({"requests": wandb.Table(columns=cols + text_cols, data=rows)})
        finally:
            self.run.finish(exit_code=exit_code)
            self.run = None


def sweep_group() -> str | None:
    """In a Hydra multirun, the sweep folder: the W&B group every job of the sweep shares."""
    try:
        hydra_cfg = HydraConfig.get()
    except ValueError:  # not under Hydra (the Python API)
        return None
    return str(hydra_cfg.sweep.dir) if hydra_cfg.mode == RunMode.MULTIRUN else None


def _should_log(step: int, interval: int | None) -> bool:
    """Every ``interval``-th step; ``None`` thins long runs: every step up to 1,000, every 10th up to
    10,000, every 100th up to 100,000, ... (a simulated trace has hundreds of thousands of steps)."""
    if interval:
        return step % interval == 0
    every = 1
    while step >= 1000 * every:
        every *= 10
    return step % every == 0


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}/"))
        else:
            out[f"{prefix}{k}"] = v
    return out


def make_logger(cfg: DictConfig) -> RunLogger:
    """``logger=wandb`` (mode from ``logger.mode``) or ``logger=none``."""
    if cfg.name == "none" or cfg.mode == "disabled":
        return RunLogger()
    if cfg.name == "wandb":
        return WandbLogger(cfg)
    raise ValueError(f"logger.name={cfg.name!r} is not one of wandb, none")
