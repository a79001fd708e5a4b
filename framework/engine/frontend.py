"""The API server in front of an engine (``frontend``), priced on the virtual clock.

A real server spends CPU time outside the engine's steps: it parses the HTTP request and
tokenises the prompt before the engine sees it, and detokenises and streams every output token
after the step that sampled it. :class:`FrontEnd` models that with three costs:

- a request reaches the engine ``per_request_s + per_prompt_token_s x prompt_len`` after the
  client sent it (:meth:`FrontEnd.arrivals`); its TTFT and E2E still count from the send;
- each step's tokens go through one serial front end, a single-server FIFO queue: the work of a
  step that ended at ``t`` with ``n`` tokens starts at ``max(t, when the previous step's work
  ended)`` and takes ``n x per_output_token_s``; its tokens reach the client together when it ends
  (:meth:`FrontEnd.deliver`: one output batch per step, as an engine's output processor hands them on);
- ``in_engine_process`` (vLLM <= 0.5 ran the API server and the detokenizer in the engine's
  process): the token work is the engine's, added to each step's time by the clock
  (:meth:`FrontEnd.step_cost_s`), and tokens reach the client when the step ends.

Policies never see it: only the token timestamps the metrics read and the requests' arrival
times at the engine change.
"""

from __future__ import annotations

import dataclasses
import heapq
from dataclasses import dataclass
from typing import Iterable, Iterator

from servelab.core.request import Request, Sequence
from servelab.engine.arrival_source import ArrivalSource


@dataclass
class FrontEnd:
    per_request_s: float = 0.0
    per_prompt_token_s: float = 0.0
    per_output_token_s: float = 0.0
    in_engine_process: bool = False
    free_at: float = 0.0  # when the serial front end finishes the token work handed to it so far

    @property
    def delays_requests(self) -> bool:
        return bool(self.per_request_s or self.per_prompt_token_s)

    @property
    def delays_tokens(self) -> bool:
        """Whether token timestamps move (out of the engine's process, with a per-token cost)."""
        return bool(self.per_output_token_s) and not self.in_engine_process

    def request_delay_s(self, request: Request) -> float:
        return self.per_request_s + self.per_prompt_token_s * request.prompt_len

    def step_cost_s(self, num_sampled: int) -> float:
        """What the front end's token work adds to a step run in the engine's process."""
        return self.per_output_token_s * num_sampled if self.in_engine_process else 0.0

    def deliver(self, step_end: float, num_tokens: int) -> float:
        """When the ``num_tokens`` tokens of the step that ended at ``step_end`` reach the client
        (called once per step, in step order)."""
        if not num_tokens or not self.delays_tokens:
            return step_end
        self.free_at = max(self.free_at, step_end) + num_tokens * self.per_output_token_s
        return self.free_at

    def arrivals(self, requests: Iterable[Request], time_scale: float = 1.0) -> "EngineArrivals":
        """``requests`` (sorted by send time here unless they say ``in_arrival_order``) as they reach
        the engine: in that order, each with ``arrival_time`` = its arrival at the engine and
        ``sent_time`` = the client's send (both in workload units: ``x time_scale`` is seconds)."""
        return EngineArrivals(self, requests, time_scale)


class EngineArrivals:
    """An iterable of the requests as they reach the engine (see :meth:`FrontEnd.arrivals`)."""

    in_arrival_order = True

    def __init__(self, frontend: FrontEnd, requests: Iterable[Request], time_scale: float) -> None:
        self.frontend, self.time_scale = frontend, time_scale
        self.requests = requests if getattr(requests, "in_arrival_order", False) else \
            sorted(requests, key=lambda r: r.arrival_time)

    def __iter__(self) -> Iterator[Request]:
        # A request reaches the engine no earlier than it was sent, so one held here may go once the
        # next request to be sent is sent at or after its arrival: a heap of the ones in the front end.
        held: list[tuple[float, int, Request]] = []
        for i, request in enumerate(self.requests):
            while held and held[0][0] <= request.arrival_time:
                yield heapq.heappop(held)[2]
            at = request.arrival_time + self.frontend.request_delay_s(request) / self.time_scale
            heapq.heappush(held, (at, i, _arriving(request, at)))
        while held:
            yield heapq.heappop(held)[2]


def _arriving(request: Request, at: float) -> Request:
    moved = dataclasses.replace(request, arrival_time=at, sent_time=request.arrival_time)
    if "token_id_bounds" in request.__dict__:  # drawn from a vocabulary: no pass over the prompt (drawn_from)
        moved.__dict__["token_id_bounds"] = request.__dict__["token_id_bounds"]
    return moved


class DelayedArrivals:
    """An arrival source (:mod:`servelab.workloads.arrivals`: closed-loop clients, whose sends are
    known only as requests end) behind the front end: a request the source sends at ``t`` reaches
    the engine at ``t + request_delay_s`` (engine seconds: closed loop runs at a time scale of 1),
    with ``sent_time`` = ``t``. Ends go to the source, which decides the clients' next sends."""

    def __init__(self, source: ArrivalSource, frontend: FrontEnd) -> None:
        self.source, self.frontend = source, frontend
        self.stops_spans_at_ends = source.stops_spans_at_ends
        self.concurrency = source.concurrency
        self._held: list[tuple[float, int, Request]] = []  # (reaches the engine, order, request): a heap
        self._order = 0

    @property
    def exhausted(self) -> bool:
        return self.source.exhausted and not self._held

    def next_time(self) -> float:
        held = self._held[0][0] if self._held else float("inf")
        return min(held, float(self.source.next_time()))

    def pop_due(self, now: float) -> tuple[Request, float] | None:
        due = self.source.pop_due(now)
        while due is not None:
            request, sent = due
            at = sent + self.frontend.request_delay_s(request)
            heapq.heappush(self._held, (at, self._order, _arriving(request, at)))
            self._order += 1
            due = self.source.pop_due(now)
        if self._held and self._held[0][0] <= now:
            at, _, request = heapq.heappop(self._held)
            return request, at
        return None

    def on_end(self, seq: Sequence) -> None:
        self.source.on_end(seq)
