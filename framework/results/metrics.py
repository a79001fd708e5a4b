"""Per-request results and the run summary (definitions follow vLLM's benchmark and Sarathi/Vidur).

TTFT = first token - arrival; TPOT = (e2e - TTFT) / (output tokens - 1); ITL = gaps between
consecutive tokens; queueing delay = first scheduled - arrival; goodput = requests meeting every
SLO per second. A request without any target (its own or the run's ``slo.*``) neither meets nor
misses an SLO: attainment and goodput cover only requests with targets and are ``None`` when no
request has one (a 1.0 there would read as "every SLO met"). Every key is documented in
``docs/metrics.md``.
"""

from __future__ import annotations

import itertools
import re
from array import array
from typing import Iterable

import numpy as np

from servelab.core.request import Sequence, Status
from servelab.engine.step_totals import StepTotals
from servelab.results.fairness import DEFAULT_WEIGHTS, ServiceLog, fairness_figures
from servelab.results.itl import NUMPY_LIMIT, derived_itls, itl_figures, request_itl_stats
from servelab.results.itl import itl_micros as itl_micros_of
from servelab.results import spill


#: Seconds a latency may fall below zero by float rounding before it is an error.
NEGATIVE_TOLERANCE_S = 1e-9


class NegativeLatencyError(RuntimeError):
    """A request's TTFT, E2E or queueing delay came out negative: a token or a scheduling time
    before its arrival. Always a bug in whatever drove the engine (a request run before it
    arrived), never bad input; an error rather than a clamp to 0, which would hide the bug inside
    the percentiles."""


#: ``results.requests_format``: the default (every ITL, ``itl_ms``) and the one for long runs (``itl_ms_stats``).
REQUESTS_FORMATS = ("jsonl", "stats")


def request_record(seq: Sequence, time_scale: float, ttft_slo_ms: float | None,
                   tpot_slo_ms: float | None, requests_format: str = "jsonl", itl_micros: np.ndarray | None = None,
                   token_ids: bool = True, itl_list: bool = True) -> dict:
    """One line of ``requests.jsonl``. Raises :class:`NegativeLatencyError`, naming the request,
    if its first token, last token or first scheduling came before its arrival. ``requests_format``
    ``"stats"``: the record has ``itl_ms_stats`` (:func:`~servelab.results.itl.request_itl_stats`)
    where ``itl_ms`` would list every gap. ``itl_micros``: ``itl_micros(seq.token_times)`` when the
    caller has it already (the writer, which writes the list's text from it). ``token_ids=False``:
    ``output_token_ids`` is None (the simulator's placeholders), without copying them first.
    ``itl_list=False``: ``itl_ms`` is None instead of the list (stats format: no effect), for a caller
    that writes the list's text from ``itl_micros`` and whose readers do not look at it (the writer)."""
    stats_format = requests_format == "stats"
    req = seq.request
    arrival = (req.arrival_time if req.sent_time is None else req.sent_time) * time_scale  # the client's send
    n = seq.num_output_tokens
    times = seq.token_times
    ttft = tpot = e2e = None
    itl: list | dict | None = None if stats_format or not itl_list else []
    if times:
        first, last = times[0], times[-1]
        ttft, e2e = (first - arrival) * 1e3, (last - arrival) * 1e3
        tpot = (last - first) * 1e3 / (n - 1) if n > 1 else 0.0
        # to the microsecond: JSON writes a 3-decimal float ~5x faster than a full 17-digit one, and
        # a simulated trace writes millions of them
        micros = itl_micros_of(times) if itl_micros is None else itl_micros
        if stats_format:
            itl = request_itl_stats(micros / 1000.0)  # itl_ms(seq.token_times)
        elif itl_list:
            itl = (micros / 1000.0).tolist()
    queue = None if seq.first_scheduled_time is None else (seq.first_scheduled_time - arrival) * 1e3
    floor = -NEGATIVE_TOLERANCE_S * 1e3
    if (ttft is not None and e2e is not None and (ttft < floor or e2e < floor)) or (queue is not None and queue < floor):
        _negative_latency(req.id, arrival, ttft, e2e, queue)
    ttft_target = req.ttft_slo_ms if req.ttft_slo_ms is not None else ttft_slo_ms
    tpot_target = req.tpot_slo_ms if req.tpot_slo_ms is not None else tpot_slo_ms
    status = seq.status
    if status is Status.ABORTED:  # the client left: neither met nor missed a target
        ttft_target = tpot_target = None
    finished = status is Status.FINISHED
    # None = no target of that kind; an unfinished request with a target misses it
    met_ttft = None if ttft_target is None else finished and ttft is not None and ttft <= ttft_target
    met_tpot = None if tpot_target is None else finished and tpot is not None and tpot <= tpot_target
    met = None if ttft_target is None and tpot_target is None else met_ttft is not False and met_tpot is not False
    drafts = seq.num_draft_tokens
    return {
        "id": req.id,
        "prompt_len": req.prompt_len,
        "max_tokens": req.max_tokens,
        "output_len": n,
        "output_token_ids": list(seq.output_token_ids) if token_ids else None,
        "arrival_s": arrival,
        "priority": req.priority,
        "client_id": req.client_id,
        "slo_class": req.slo_class,
        "num_preemptions": seq.num_preemptions,
        "num_cached_prompt_tokens": seq.num_cached_prompt_tokens,
        "num_draft_tokens": drafts,
        "num_accepted_tokens": seq.num_accepted_tokens,
        "spec_acceptance_rate": seq.num_accepted_tokens / drafts if drafts else None,
        "num_verify_steps": seq.num_verify_steps,
        "spec_drafted_by_position": list(seq.drafted_by_position),
        "spec_accepted_by_position": list(seq.accepted_by_position),
        "finish_reason": seq.finish_reason,
        "rejected_reason": seq.rejected_reason,
        "ttft_ms": ttft, "tpot_ms": tpot, "e2e_ms": e2e, "queue_ms": queue,
        "itl_ms_stats" if stats_format else "itl_ms": itl,  # the same place in the line, under its own name
        "met_slo": met, "met_ttft_slo": met_ttft, "met_tpot_slo": met_tpot,
    }


def _negative_latency(request_id: str, arrival: float, ttft: float | None, e2e: float | None,
                      queue: float | None) -> None:
    """Raise :class:`NegativeLatencyError` for the first of the latencies below zero (beyond rounding)."""
    for key, value in (("ttft_ms", ttft), ("e2e_ms", e2e), ("queue_ms", queue)):
        if value is not None and value < -NEGATIVE_TOLERANCE_S * 1e3:
            raise NegativeLatencyError(f"request {request_id!r}: {key}={value:.3f} < 0 (arrival at {arrival:.6f} s, "
                                       "yet it ran before then: the engine was stepped ahead of its arrival)")


def rejection_kind(reason: str) -> str:
    """A rejection reason with its numbers replaced by N, so reasons group by kind ("needs N KV
    slots (N blocks of N) but the whole pool has N blocks")."""
    return _NUMBER.sub("N", reason)


_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def stats(values: Iterable[float]) -> dict[str, float | None]:
    arr = (np.frombuffer(values, dtype=float) if isinstance(values, array)
           else np.asarray([v for v in values if v is not None], dtype=float))
    if arr.size == 0:
        return {"mean": None, "p50": None, "p90": None, "p99": None}
    p50, p90, p99 = np.percentile(arr, [50, 90, 99])
    return {"mean": float(arr.mean()), "p50": float(p50), "p90": float(p90), "p99": float(p99)}


def _count_slo(into, rec: dict) -> None:
    """Count ``rec``'s targets and whether it met them into ``into`` (its ``with_*`` and ``met*``)."""
    for flag, count, met in (("met_slo", "with_slo", "met"), ("met_ttft_slo", "with_ttft", "met_ttft"),
                             ("met_tpot_slo", "with_tpot", "met_tpot")):
        if rec[flag] is not None:
            setattr(into, count, getattr(into, count) + 1)
            setattr(into, met, getattr(into, met) + bool(rec[flag]))


class SloClassStats:
    """One SLO class's figures (its admitted requests): what ``summary.json``'s ``slo_classes`` says."""

    def __init__(self) -> None:
        self.num_requests = self.met = self.met_ttft = self.met_tpot = 0
        self.with_slo = self.with_ttft = self.with_tpot = 0
        self.ttft, self.tpot = array("d"), array("d")

    def add(self, rec: dict) -> None:
        self.num_requests += 1
        _count_slo(self, rec)
        if rec["finish_reason"] in ("stop", "length"):
            if rec["ttft_ms"] is not None:
                self.ttft.append(rec["ttft_ms"])
            if rec["output_len"] > 1 and rec["tpot_ms"] is not None:
                self.tpot.append(rec["tpot_ms"])

    def figures(self, duration: float) -> dict:
        return {"num_requests": self.num_requests, "num_requests_with_slo": self.with_slo,
                **slo_figures(self, duration), "ttft_ms": stats(self.ttft), "tpot_ms": stats(self.tpot)}


def slo_figures(r, duration: float) -> dict:
    """Attainment and goodput of the counts ``r`` holds (a run's, or one SLO class's)."""
    return {
        "slo_attainment": r.met / r.with_slo if r.with_slo else None,
        "ttft_slo_attainment": r.met_ttft / r.with_ttft if r.with_ttft else None,
        "tpot_slo_attainment": r.met_tpot / r.with_tpot if r.with_tpot else None,
        "goodput_req_s": r.met / duration if r.with_slo else None,
    }


class RequestStats:
    """Folds request records (``requests.jsonl`` lines) into what the summary needs, so a run can
    write each record as its request ends and keep only numbers (memory stays flat in the number
    of requests; the fairness figures keep one float per output token, the token times, in a column
    that spills to a temporary file, and the inter-token latencies are derived from them:
    :meth:`itl_figures`)."""

    def __init__(self) -> None:
        self.num_requests = self.num_finished = self.num_rejected = self.num_aborted = 0
        self.output_tokens = self.prompt_tokens = self.cached_prompt_tokens = 0
        self.met = self.met_ttft = self.met_tpot = 0
        self.with_slo = self.with_ttft = self.with_tpot = 0  # requests (not rejected) with such a target
        self.rejections: dict[str, list] = {}  # reason -> [count, first request id]
        self.ttft, self.tpot, self.e2e, self.queue = (array("d") for _ in range(4))
        # per entry of ``service`` (each request not rejected): whether its ITLs count, derived from
        # the token times it keeps (a finished request added with its sequence)
        self.itl_from_times = bytearray()
        self.itl_from_records = array("d")  # the ITLs of finished requests added without their sequence
        self.draft_tokens = self.accepted_tokens = self.verify_steps = 0
        self.drafted_by_position: list[int] = []  # [i]: verify steps that had a draft at position i
        self.accepted_by_position: list[int] = []  # [i]: of which kept it
        self.service = ServiceLog()  # per-client service over time: the fairness figures
        self.slo_classes: dict[str, SloClassStats] = {}  # slo_class -> its figures (summary.json's slo_classes)

    def add(self, rec: dict, seq: Sequence | None = None) -> None:
        """Fold one record in; its sequence, when there is one, gives the fairness figures exact times."""
        self.num_requests += 1
        self.service.add_record(rec, seq)
        self.output_tokens += rec["output_len"]
        self._add_speculation(rec)
        if rec["rejected_reason"] is not None:
            self.num_rejected += 1
            reason = rec["rejected_reason"]
            entry = self.rejections.setdefault(rejection_kind(reason), [0, rec["id"], reason])
            entry[0] += 1
            return
        finished = rec["finish_reason"] in ("stop", "length")
        self.itl_from_times.append(finished and seq is not None)
        if finished and seq is None:
            self.itl_from_records.extend(rec.get("itl_ms") or ())  # a stats-format record has none
        self.prompt_tokens += rec["prompt_len"]
        self.cached_prompt_tokens += rec["num_cached_prompt_tokens"]
        _count_slo(self, rec)
        if rec.get("slo_class") is not None:
            self.slo_classes.setdefault(rec["slo_class"], SloClassStats()).add(rec)
        if rec["finish_reason"] is None:
            return
        if rec["finish_reason"] == "abort":  # left early: its latencies describe no whole request
            self.num_aborted += 1
            return
        self.num_finished += 1
        for values, key in ((self.ttft, "ttft_ms"), (self.e2e, "e2e_ms"), (self.queue, "queue_ms")):
            if rec[key] is not None:
                values.append(rec[key])
        if rec["output_len"] > 1 and rec["tpot_ms"] is not None:
            self.tpot.append(rec["tpot_ms"])

    def itl_figures(self, memory_limit: int | None = None) -> dict[str, float | None]:
        """``stats`` of every finished request's ITLs, in the order they were added (those derived
        from token times, then those of records added without a sequence), exactly as over one list;
        ``memory_limit``: values held at once (default: the smaller of
        :data:`servelab.results.spill.MEMORY_LIMIT` and :data:`servelab.results.itl.NUMPY_LIMIT`)."""
        memory_limit = min(spill.MEMORY_LIMIT, NUMPY_LIMIT) if memory_limit is None else memory_limit
        ntok = np.asarray(self.service.ntok, dtype=np.int64)
        counted = np.frombuffer(bytes(self.itl_from_times), dtype=np.bool_) if self.itl_from_times else np.zeros(0, bool)
        batch = min(memory_limit, 1 << 20)  # token times derived at once (a few arrays of this many)
        batches = itertools.chain(derived_itls(self.service.times, ntok, counted, batch) if counted.any() else (),
                                  [np.asarray(self.itl_from_records, dtype=float)])
        return itl_figures(batches, memory_limit, stats)

    def _add_speculation(self, rec: dict) -> None:
        if not rec.get("num_draft_tokens"):
            return
        self.draft_tokens += rec["num_draft_tokens"]
        self.accepted_tokens += rec["num_accepted_tokens"]
        self.verify_steps += rec["num_verify_steps"]
        for i, (drafted, kept) in enumerate(zip(rec["spec_drafted_by_position"], rec["spec_accepted_by_position"])):
            if i == len(self.drafted_by_position):
                self.drafted_by_position.append(0)
                self.accepted_by_position.append(0)
            self.drafted_by_position[i] += drafted
            self.accepted_by_position[i] += kept

    def speculation(self) -> dict:
        """Speculative decoding, over every request that verified drafts (``None`` when none did).

        ``spec_mean_tokens_per_verify`` counts the target's own token too (1 = no draft ever kept),
        over verify steps only: a drafter that drafts less often can score higher on it and still
        save fewer steps. ``spec_steps_saved_fraction`` is what ranks drafters on one workload: each
        kept draft token is one model pass a sequence did not need, out of the one pass per output
        token plain decoding takes (``num_accepted_tokens / output_tokens``).
        ``spec_accepted_by_position[i]`` is the fraction of drafts at position i (0 = the first
        draft of a step) that were kept.
        """
        if not self.verify_steps:
            return {"num_draft_tokens": 0, "num_accepted_tokens": 0, "spec_acceptance_rate": None,
                    "spec_mean_tokens_per_verify": None, "spec_steps_saved_fraction": None,
                    "spec_accepted_by_position": []}
        return {
            "num_draft_tokens": self.draft_tokens,
            "num_accepted_tokens": self.accepted_tokens,
            "spec_acceptance_rate": self.accepted_tokens / self.draft_tokens,
            "spec_mean_tokens_per_verify": (self.accepted_tokens + self.verify_steps) / self.verify_steps,
            "spec_steps_saved_fraction": self.accepted_tokens / self.output_tokens if self.output_tokens else None,
            "spec_accepted_by_position": [k / d for k, d in zip(self.accepted_by_position, self.drafted_by_position)],
        }

    @classmethod
    def of(cls, records, seqs=None) -> "RequestStats":
        """The stats of ``records`` (with ``seqs``, their sequences in the same order)."""
        stats = cls()
        for rec, seq in zip(records, seqs if seqs is not None else itertools.repeat(None)):
            stats.add(rec, seq)
        return stats


def summarize(requests: RequestStats, totals: StepTotals, duration_s: float, leaked_blocks: int | None,
              extra: dict | None = None, fairness_weights: tuple[float, float] = DEFAULT_WEIGHTS) -> dict:
    """``summary.json``: throughput, latency percentiles, SLO attainment, KV use, preemptions, and
    fairness between clients (service weighted by ``fairness_weights``: input, output)."""
    r = requests
    duration = max(duration_s, 1e-9)
    preemptions = dict(totals.preemptions)
    summary = {
        "num_requests": r.num_requests,
        "num_finished": r.num_finished,
        "num_rejected": r.num_rejected,
        "num_aborted": r.num_aborted,
        "num_unfinished": r.num_requests - r.num_finished - r.num_rejected - r.num_aborted,
        "duration_s": duration_s,
        "num_steps": totals.num_steps,
        "output_tokens": r.output_tokens,
        "prompt_tokens": r.prompt_tokens,
        "output_throughput_tok_s": r.output_tokens / duration,
        "request_throughput_req_s": r.num_finished / duration,
        "ttft_ms": stats(r.ttft),
        "tpot_ms": stats(r.tpot),
        "itl_ms": r.itl_figures(),
        "e2e_ms": stats(r.e2e),
        "queue_ms": stats(r.queue),
        "num_requests_with_slo": r.with_slo,
        **slo_figures(r, duration),
        # per SLO class (workload.slo_classes, a jsonl line's slo_class), by name; null without classes
        "slo_classes": {name: c.figures(duration) for name, c in sorted(r.slo_classes.items())} or None,
        "num_preemptions": sum(preemptions.values()),
        "num_preemptions_by_kind": preemptions,
        "kv_utilization_mean": totals.kv_utilization_mean,
        "kv_utilization_max": totals.kv_utilization_max,
        "leaked_blocks": leaked_blocks,
        # kind of reason -> {count, example_id, example_reason}, most frequent first
        "rejections": {kind: {"count": n, "example_id": rid, "example_reason": reason} for kind, (n, rid, reason)
                       in sorted(r.rejections.items(), key=lambda kv: -kv[1][0])},
        **r.speculation(),
        **fairness_figures(r.service, *fairness_weights),
    }
    summary.update(extra or {})
    return summary
