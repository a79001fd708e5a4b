"""What one job writes, shared by the one-engine job (:mod:`servelab.run.session`) and the cluster
job (:mod:`servelab.run.cluster_run`): the result (:class:`RunResult`), the request records as they
end (:class:`RequestWriter`), and :func:`run_and_write`, which runs a job and writes its results
however it ends."""

from __future__ import annotations

import json
import logging
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Callable, TextIO

import numpy as np
from omegaconf import DictConfig, OmegaConf
from tqdm.auto import tqdm
from tqdm.autonotebook import tqdm as notebook_tqdm
from tqdm.std import tqdm as std_tqdm

from servelab.config.checkpoint import recorded_config
from servelab.core.interfaces import EngineLimits
from servelab.engine.engine import Engine, StepRecord
from servelab.engine.timeline import FILE as TIMELINE_FILE
from servelab.results.itl import itl_micros
from servelab.results.itl_text import ItlText
from servelab.results.metrics import REQUESTS_FORMATS, RequestStats, request_record

log = logging.getLogger(__name__)


class RunResult:
    """What a run produced: one dict per request (``requests.jsonl``), the summary, the steps.

    A run written as it went (``run_job``) reads its request records back from
    ``requests.jsonl`` on first use of :attr:`requests`, so a long run never holds them all.
    """

    def __init__(self, requests: list[dict] | None, summary: dict, steps: list[StepRecord] | None = None,
                 requests_path: Path | None = None, timelines: list[dict] | None = None) -> None:
        self._requests = requests
        self.summary = summary
        self.steps = steps if steps is not None else []
        self.requests_path = requests_path
        self.timelines = timelines or []  # per replica: its StepTimeline's columns ({} where none came)

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
        """Write ``requests.jsonl`` (unless already streamed there), ``summary.json``, ``timeline.npz``
        (:func:`write_timeline`) and (if ``log_steps``) ``steps.jsonl``."""
        out = Path(output_dir)
        out.mkdir(parents=True, exist_ok=True)
        target = out / "requests.jsonl"
        if self.requests_path is None or self.requests_path.resolve() != target.resolve():
            with target.open("w") as fh:
                for rec in self.iter_requests():
                    fh.write(json.dumps(rec) + "\n")
        (out / "summary.json").write_text(json.dumps(self.summary, indent=2) + "\n")
        if any(self.timelines):
            write_timeline(out / TIMELINE_FILE, self.timelines)
        if log_steps:
            with (out / "steps.jsonl").open("w") as fh:
                for s in self.steps:
                    fh.write(json.dumps(asdict(s)) + "\n")




def write_timeline(path: Path, timelines: list[dict]) -> None:
    """``timeline.npz``: replica ``i``'s column ``c`` (:mod:`servelab.engine.timeline`) as array ``r<i>.<c>``
    (a one-engine run is replica 0); a replica without columns is left out."""
    arrays = {f"r{i}.{name}": np.frombuffer(column, dtype=column.typecode) if len(column) else np.array([])
              for i, columns in enumerate(timelines) for name, column in columns.items()}
    with path.open("wb") as fh:  # a file object: numpy would append .npz to a name without it
        np.savez_compressed(fh, **arrays)  # type: ignore[arg-type]  # mypy matches **arrays to allow_pickle: bool


_ITL_MARK = "\u0000itl_ms"  # no record holds this string: replaced by the list's text
_ITL_MARK_JSON = json.dumps(_ITL_MARK)
_ITL_TEXT = ItlText()


def _json_encoder() -> Callable[[dict], str]:
    """``json.dumps`` with its default arguments, less its per-call set-up (a new encoder each call,
    a few microseconds, as much as a short record's encoding): json's own C encoder, made once with
    the arguments ``json.dumps`` gives it, so the text is the same; ``json.dumps`` itself where
    there is no C encoder. Unlike ``json.dumps`` it does not look for circular references (a
    record has none)."""
    make = getattr(json.encoder, "c_make_encoder", None)  # CPython's C accelerator; None without it
    if make is None:
        return json.dumps
    encode = make(None, json.JSONEncoder().default, json.encoder.encode_basestring_ascii, None, ": ", ", ",
                  False, False, True)
    return lambda obj: "".join(encode(obj, 0))  # Python 3.10 gives the text in pieces


_dumps = _json_encoder()


def record_line(rec: dict, itl_micros: np.ndarray | None = None) -> str:
    """``json.dumps(rec)``, the same text, with the ``itl_ms`` list written by :class:`ItlText` from
    ``itl_micros``, the list's values in microseconds (:func:`~servelab.results.itl.itl_micros`;
    None: the list is written by ``json.dumps`` too)."""
    itl = rec.get("itl_ms")
    if not itl or itl_micros is None:
        return _dumps(rec)
    rec["itl_ms"] = _ITL_MARK  # in place of a copy of the record; put back below
    try:
        line = _dumps(rec)
    finally:
        rec["itl_ms"] = itl
    return line.replace(_ITL_MARK_JSON, _ITL_TEXT.text(itl_micros), 1)


def requests_format(cfg) -> str:
    """``results.requests_format`` of run config ``cfg`` (``jsonl`` where it has none)."""
    section = cfg.get("results") if cfg is not None else None
    value = "jsonl" if section is None else section.get("requests_format", "jsonl")
    return getattr(value, "value", value)




class RequestWriter:
    """Writes each request's record to ``requests.jsonl`` as it ends and keeps only its numbers
    (:class:`RequestStats`); attach with ``engine.end_listeners`` and ``engine.forget_ended``."""

    def __init__(self, path: Path, engine: Engine | None, time_scale: float, decorate=None, live=None,
                 limits: EngineLimits | None = None, requests_format: str = "jsonl") -> None:
        """``limits``: whose SLO targets the records are judged by (default ``engine``'s; an engine
        process's, sent to the parent of a wall-clock cluster, which holds no engine).
        ``requests_format``: ``results.requests_format`` (:func:`requests_format`)."""
        if requests_format not in REQUESTS_FORMATS:
            raise ValueError(f"results.requests_format={requests_format!r} is not one of {list(REQUESTS_FORMATS)}")
        self.requests_format = requests_format
        self.path, self.engine, self.time_scale, self.decorate = path, engine, time_scale, decorate
        if limits is None:
            assert engine is not None, "RequestWriter needs an engine or its limits"
            limits = engine.limits
        self.limits = limits
        self.live = live  # () -> the sequences not yet ended (default: the engine's); a cluster has its own
        self.stats = RequestStats()
        # told of each record as it is written (the logger's table); one whose function has
        # ``reads_itl_ms = False`` may get the record with a placeholder where the ITL list would be
        self.record_listeners: list = []
        self._fh = path.open("w")

    def on_end(self, seq) -> None:
        self._write(seq)

    def _write(self, seq) -> None:
        limits = self.limits
        micros = itl_micros(seq.token_times)  # once: the record's list and its text
        placeholders = self.decorate is drop_placeholder_tokens  # done by request_record
        itl_list = self.requests_format != "jsonl" or self._reads_itl_ms(placeholders)
        rec = request_record(seq, self.time_scale, limits.ttft_slo_ms, limits.tpot_slo_ms, self.requests_format,
                             micros, token_ids=not placeholders, itl_list=itl_list)
        if not itl_list:  # none reads the list: record_line writes its text from the microseconds
            rec["itl_ms"] = _ITL_MARK
        itl = rec.get("itl_ms")
        if self.decorate is not None and not placeholders:
            self.decorate(rec, seq)
        self.stats.add(rec, seq)
        for listener in self.record_listeners:
            listener(rec)
        # the microseconds describe the list only while it is the one the record was made with
        self._fh.write(record_line(rec, micros if rec.get("itl_ms") is itl else None) + "\n")

    def _reads_itl_ms(self, placeholders: bool) -> bool:
        """Whether a record's ``itl_ms`` list is read before it is written: by a decorator (other than
        the simulator's) or by a record listener not marked ``reads_itl_ms = False`` (the loggers'
        ``log_request``). The list is a Python float per token; the line needs only its text."""
        if self.decorate is not None and not placeholders:
            return True
        return any(getattr(listener, "reads_itl_ms", True) for listener in self.record_listeners)

    def close(self) -> None:
        """Write the sequences that have not ended (an interrupted run) and close the file."""
        live = self.live() if self.live is not None else self.engine.sequences.values() if self.engine else ()
        for seq in list(live):
            if not seq.is_finished:
                self._write(seq)
        self._fh.close()


def kv_pool_metrics(executor) -> dict:
    """The KV pool of one rank: its blocks, and its bytes (quantised values and their scales included)."""
    blocks = executor.num_kv_blocks
    return {"kv_pool_blocks": blocks, "kv_pool_bytes": blocks * executor.bytes_per_block}


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
        OmegaConf.save(recorded_config(cfg), output_dir / "config.yaml", resolve=True)  # a checkpoint's real shape
        if cfg.get("report"):
            write_report(output_dir)
        logger.finish(result.summary, result.iter_requests(), exit_code)
        if exit_code == 1:  # an error; the command line reports an interrupt or all-rejected run itself
            log.error("run %s; partial results written to %s", status, output_dir)
    return result


def write_report(output_dir: Path) -> None:
    """``report=true``: the run's page (:mod:`servelab.results.page`) in its folder, however the run ended."""
    from servelab.results.page import write_page  # noqa: PLC0415 - matplotlib only when a page is asked for

    try:
        log.info("report: %s", write_page([output_dir], output_dir, "report=true"))
    except Exception as exc:  # noqa: BLE001 - the results are written; a page that fails must not hide the run's end
        log.warning("report=true: no page written: %s: %s", type(exc).__name__, exc)


def drop_placeholder_tokens(rec: dict, seq) -> None:
    """The simulator's records say ``output_token_ids: null``: its tokens are placeholders (``output_len``
    counts them), and encoding hundreds of zeros per request only costs a long simulated run time."""
    rec["output_token_ids"] = None


def _progress_bar(total: int, enabled: bool, stream: TextIO | None = None):
    """The run's progress on ``stream`` (stderr): tqdm's bar on a terminal or in a notebook, else
    (a log file, a pipe) :class:`LineProgress`, whose lines a file keeps apart."""
    if not enabled:
        return None
    stream = stream or sys.stderr
    if notebook_tqdm is std_tqdm and not stream.isatty():
        return LineProgress(total, stream)
    return tqdm(total=total, desc="requests", unit="req", dynamic_ncols=True, leave=False, file=stream)


class LineProgress:
    """Progress for a stream that is not a terminal: one line, ending in a newline, each time another
    tenth of the requests has ended or ``every_s`` seconds have passed since the last line, and one at
    the end (tqdm's bar redraws itself with carriage returns, which a file keeps as one long line)."""

    FORMAT = "{desc}: {n_fmt}/{total_fmt} ({percentage:.0f}%) [{elapsed}<{remaining}, {rate_fmt}]"

    def __init__(self, total: int, stream: TextIO, every_s: float = 60.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.total, self.stream, self.every_s, self.clock = total, stream, every_s, clock
        self.n = self._shown = 0
        self._start = self._last = clock()

    def update(self, n: int = 1) -> None:
        self.n += n
        now = self.clock()
        if self._tenths(self.n) > self._tenths(self._shown) or now - self._last >= self.every_s:
            self._print(now)

    def _tenths(self, n: int) -> int:
        return 10 * n // max(1, self.total)

    def close(self) -> None:
        if self.n != self._shown:
            self._print(self.clock())

    def _print(self, now: float) -> None:
        line = tqdm.format_meter(self.n, self.total, now - self._start, prefix="requests", unit="req",
                                 bar_format=self.FORMAT)
        print(line, file=self.stream, flush=True)
        self._shown, self._last = self.n, now
