"""Run loggers: Weights & Biases (offline by default) or none.

What a W&B run costs stays a small fraction of the run: the step series is sent as one point per
window of ``logger.log_every_steps`` steps (the window's means, maxima and sums, :class:`StepWindow`),
and the requests as one table at the end (docs/results.md states the cadence).
"""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Literal, cast

from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from servelab.engine.engine import StepRecord
from servelab.engine.step_totals import StepTotals

log = logging.getLogger(__name__)

# The requests table's columns and their W&B types (declared: inferring them row by row costs
# seconds on a long trace). The text columns come only from checkpoints with a tokenizer.
REQUEST_COLUMNS = {"id": str, "prompt_len": int, "output_len": int, "arrival_s": float, "ttft_ms": float,
                   "tpot_ms": float, "e2e_ms": float, "queue_ms": float, "num_preemptions": int,
                   "finish_reason": str, "rejected_reason": str, "met_slo": bool,
                   "client_id": str}
TEXT_COLUMNS = {"prompt_text": str, "output_text": str}
TABLE_ROWS = 1_000  # logger.table_max_rows' default (W&B itself keeps at most 10,000 rows of a logged table)


class RunLogger:
    """No-op base: ``start`` once, ``attach`` to the engine, ``finish`` exactly once (even on error)."""

    def start(self, cfg: DictConfig, output_dir: Path) -> None:
        """Open the run with the resolved config."""

    def where(self) -> str:
        """Where the run's log goes (the start-up banner shows it)."""
        return "off (logger=none)"

    def attach(self, engine) -> None:
        """Listen to ``engine``'s steps. The base listens to none: ``logger=none`` costs nothing per step."""

    def detach(self, engine) -> None:
        """Stop listening to ``engine``'s steps (the run ended; the engine may run again)."""

    def log_step(self, record: StepRecord) -> None:
        """Fold in one step's numbers (batch size, tokens, KV utilisation, ...)."""

    def log_request(self, record: dict) -> None:
        """One request's record (a line of ``requests.jsonl``) as it ends."""

    log_request.reads_itl_ms = False  # type: ignore[attr-defined]  # the writer may leave the list unmade

    def finish(self, summary: dict, requests: Iterable[dict], exit_code: int = 0) -> None:
        """Record the summary and the requests table (from ``requests`` unless ``log_request`` was told
        of them), and close the run."""


class StepWindow:
    """The step series at a stated cadence: one point per ``every`` steps, holding the window's means
    (batch size, tokens, durations, KV utilisation), the KV utilisation's maximum, the sums of preemptions and drafts, the tokens per
    second of engine time over the window, and the queue lengths at its end.

    A window closes once it holds ``every`` steps and ``min_interval_s`` seconds of wall time have
    passed since the previous point: a fast run (the simulator, ~0.2 ms a step) sends at most one
    point per ``min_interval_s``, so the ~0.5-2 ms a ``log`` call costs stays about 1% of the run;
    ``min_interval_s=0`` makes every window exactly ``every`` steps.

    ``log_step`` folds a step into the window's :class:`StepTotals` (no dict is built); a point is
    built and handed to ``send(data, step)`` only when a window closes, and ``flush`` sends a partial
    last window.
    """

    def __init__(self, send: Callable[[dict, int], None], every: int = 100, min_interval_s: float = 0.25,
                 queue_lengths: Callable[[], dict[str, int]] | None = None,
                 clock: Callable[[], float] = time.perf_counter) -> None:
        if every < 1:
            raise ValueError(f"logger.log_every_steps={every} must be >= 1")
        if min_interval_s < 0:
            raise ValueError(f"logger.log_min_interval_s={min_interval_s} must be >= 0")
        self.send, self.every, self.min_interval_s = send, every, min_interval_s
        self.queue_lengths, self.clock = queue_lengths, clock
        self._reset(0.0)
        self._last: StepRecord | None = None
        self._sent_at = -math.inf
        self.num_points = 0

    def _reset(self, start_s: float) -> None:
        self.totals = StepTotals()  # the open window's steps
        self.start_s = start_s

    def log_step(self, r: StepRecord) -> None:
        totals = self.totals
        if totals.num_steps == 0:
            self.start_s = r.time_s - r.duration_s
        totals.add(r)
        self._last = r
        if totals.num_steps >= self.every and (not self.min_interval_s
                                      or self.clock() - self._sent_at >= self.min_interval_s):
            self.flush()

    # the engine need not fill each record's queues, plan entries and scheduler stats for this reader
    log_step.reads_step_details = False  # type: ignore[attr-defined]

    def flush(self) -> None:
        """Send the open window (if any step is in it) as one point."""
        r, t = self._last, self.totals
        n = t.num_steps
        if r is None or n == 0:
            return
        span = r.time_s - self.start_s
        data = {"step/num_seqs": t.num_seqs / n, "step/num_tokens": t.num_tokens / n,
                "step/prefill_tokens": t.prefill_tokens / n, "step/decode_seqs": t.decode_seqs / n,
                "step/duration_ms": t.busy_s / n * 1e3, "step/model_ms": t.model_s / n * 1e3,
                "step/comm_ms": t.comm_s / n * 1e3, "step/kv_utilization": t.kv_utilization_mean,
                "step/kv_utilization_max": t.kv_utilization_max, "step/num_preempted": t.num_preemptions,
                "step/window_steps": n, "tokens_per_s": t.num_tokens / span if span > 0 else 0.0,
                "time_s": r.time_s}
        if t.draft_tokens:
            data.update({"step/draft_tokens": t.draft_tokens, "step/accepted_tokens": t.accepted_tokens})
        queues = self.queue_lengths() if self.queue_lengths is not None else r.queues
        data.update({f"queue/{k}": v for k, v in queues.items()})
        self._reset(r.time_s)
        self.num_points += 1
        self.send(data, r.step)
        self._sent_at = self.clock()


class WandbLogger(RunLogger):
    """One W&B run per job, in ``<output_dir>/wandb``; ``logger.mode`` decides offline/online."""

    def __init__(self, cfg: DictConfig) -> None:
        self.cfg = cfg
        self.run = None
        every = cfg.get("log_every_steps", 100)
        if cfg.get("step_interval") is not None:  # the older name
            log.warning("logger.step_interval is deprecated: use logger.log_every_steps (a point per window of "
                        "that many steps)")
            every = cfg.step_interval
        self.window = StepWindow(self._send, every, float(cfg.get("log_min_interval_s", 0.25)))
        self.log_requests_table = bool(cfg.get("log_requests_table", True))
        self.sample = RequestSample(int(cfg.get("table_max_rows", TABLE_ROWS)))

    def start(self, cfg: DictConfig, output_dir: Path) -> None:
        import wandb  # noqa: PLC0415 - wandb

        lc = self.cfg
        self.run = wandb.init(
            project=lc.project, entity=lc.entity, group=lc.group or sweep_group(), tags=list(lc.tags), mode=_mode(lc),
            dir=str(output_dir), config=cast("dict[str, Any]", OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)),
            name=output_dir.name, settings=wandb.Settings(silent=True, console="off", x_disable_stats=True),
        )

    def where(self) -> str:
        if self.run is None:
            return "not started"
        if _mode(self.cfg) == "online":
            return f"online, {self.run.url}"
        return f"{_mode(self.cfg)}, {Path(self.run.dir).parent} (wandb sync uploads it)"

    def attach(self, engine) -> None:
        self.window.queue_lengths = engine.scheduler.queue_lengths  # read once per point, not per step
        engine.step_listeners.append(self.window.log_step)

    def detach(self, engine) -> None:
        engine.step_listeners.remove(self.window.log_step)

    def log_step(self, record: StepRecord) -> None:
        self.window.log_step(record)

    def log_request(self, record: dict) -> None:
        if self.log_requests_table:
            self.sample.add(record)

    log_request.reads_itl_ms = False  # type: ignore[attr-defined]  # the table has no ITL column (REQUEST_COLUMNS)

    def _send(self, data: dict, step: int) -> None:
        if self.run is not None:
            self.run.log(data, step=step)

    def finish(self, summary: dict, requests: Iterable[dict], exit_code: int = 0) -> None:
        if self.run is None:
            return
        try:
            self.window.flush()
            self.run.summary.update(_flatten(summary))
            if self.log_requests_table:
                if not self.sample.seen:  # not told of each request as it ended: read them now
                    for rec in requests:
                        self.sample.add(rec)
                table = self.sample.table()
                if table is not None:
                    self.run.log({"requests": table})
        finally:
            self.run.finish(exit_code=exit_code)
            self.run = None


class RequestSample:
    """An even sample of at most ``max_rows`` request records, in the order they come, kept as they
    come: every record while there is room, then every 2nd, 4th, ... (the rows kept so far are thinned
    to match), so it never holds more than ``max_rows`` rows however long the run."""

    def __init__(self, max_rows: int = TABLE_ROWS) -> None:
        if max_rows < 1:
            raise ValueError(f"logger.table_max_rows={max_rows} must be >= 1")
        self.max_rows, self.stride, self.seen = max_rows, 1, 0
        self.columns: list[str] | None = None
        self.rows: list[list] = []

    def add(self, rec: dict) -> None:
        if self.seen % self.stride == 0:
            if self.columns is None:  # checkpoints with a tokenizer: the text too
                self.columns = list(REQUEST_COLUMNS) + [c for c in TEXT_COLUMNS if c in rec]
            self.rows.append([rec.get(c) for c in self.columns])
            if len(self.rows) > self.max_rows:
                self.rows = self.rows[::2]
                self.stride *= 2
        self.seen += 1

    def table(self):
        """The ``requests`` W&B table (None without rows). The column types are declared, not inferred
        row by row (which costs seconds on a long trace)."""
        if not self.rows:
            return None
        import wandb  # noqa: PLC0415 - wandb

        types = {**REQUEST_COLUMNS, **TEXT_COLUMNS}
        table = wandb.Table(columns=self.columns, dtype=[types[c] for c in self.columns], optional=True)
        table.data = self.rows
        return table


def requests_table(requests: Iterable[dict], max_rows: int = TABLE_ROWS):
    """The ``requests`` table of ``requests`` (any iterable of records): see :class:`RequestSample`."""
    sample = RequestSample(max_rows)
    for rec in requests:
        sample.add(rec)
    return sample.table()


def sweep_group() -> str | None:
    """In a Hydra multirun, the sweep folder: the W&B group every job of the sweep shares."""
    try:
        hydra_cfg = HydraConfig.get()
    except ValueError:  # not under Hydra (the Python API)
        return None
    return str(hydra_cfg.sweep.dir) if hydra_cfg.mode == RunMode.MULTIRUN else None


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}/"))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _mode(cfg: DictConfig) -> Literal["online", "offline", "disabled", "shared"]:
    """``logger.mode`` as W&B spells it (the schema's enum, or a plain string)."""
    return cast(Literal["online", "offline", "disabled", "shared"], str(getattr(cfg.mode, "value", cfg.mode)))


def make_logger(cfg: DictConfig) -> RunLogger:
    """``logger=wandb`` (mode from ``logger.mode``) or ``logger=none``."""
    if cfg.name == "none" or _mode(cfg) == "disabled":
        return RunLogger()
    if cfg.name == "wandb":
        return WandbLogger(cfg)
    raise ValueError(f"logger.name={cfg.name!r} is not one of wandb, none")
