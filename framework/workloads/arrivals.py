"""Where a run's arrivals come from: the workload's own times (open loop,
:class:`~servelab.engine.arrival_source.OpenLoop`), or N clients that each send their next request
when their previous one ends (``workload.arrival=closed_loop``, :class:`ClosedLoop`). Both are
:class:`~servelab.engine.arrival_source.ArrivalSource` s. A closed-loop arrival becomes known only
when a request ends, so the driver's fast-forward spans stop after a step in which one ended
(:attr:`ClosedLoop.stops_spans_at_ends`).
"""

from __future__ import annotations

import heapq
from dataclasses import replace
from typing import Iterable

import numpy as np

from servelab.core.errors import ConfigError
from servelab.core.request import Request, Sequence
from servelab.engine.arrival_source import OpenLoop

INF = float("inf")
THINK_TIME_DISTS = ("constant", "exponential")


class ClosedLoop:
    """``concurrency`` clients; each sends the workload's next request (in the workload's order)
    at t=0, then ``think_time_s`` after its previous request ended (finished, rejected or aborted):
    a constant, or an exponential draw of that mean from a generator seeded with ``seed``. A
    request's ``arrival_time`` becomes its send time, so TTFT and E2E count from then. Ties go to
    the lower client index."""

    stops_spans_at_ends = True

    def __init__(self, requests: Iterable[Request], concurrency: int, think_time_s: float = 0.0,
                 think_time_dist: str = "constant", seed: int = 0) -> None:
        self.concurrency = concurrency
        self._pending = iter(requests)
        self._upcoming = next(self._pending, None)
        self._think_s, self._exponential = think_time_s, think_time_dist == "exponential"
        self._rng = np.random.default_rng(seed)
        self._ready = [(0.0, k) for k in range(concurrency)]  # (send time, client): a heap
        self._sender: dict[str, int] = {}  # request id -> the client waiting for it to end

    @property
    def exhausted(self) -> bool:
        return self._upcoming is None

    def next_time(self) -> float:
        return self._ready[0][0] if self._ready and self._upcoming is not None else INF

    def pop_due(self, now: float) -> tuple[Request, float] | None:
        if self._upcoming is None or not self._ready or self._ready[0][0] > now:
            return None
        at, client = heapq.heappop(self._ready)
        request = _sent_at(self._upcoming, at)
        self._upcoming = next(self._pending, None)
        self._sender[request.id] = client
        return request, at

    def on_end(self, seq: Sequence) -> None:
        client = self._sender.pop(seq.id, None)
        if client is None:
            return
        ended = seq.finish_time if seq.finish_time is not None else 0.0
        think = self._rng.exponential(self._think_s) if self._exponential and self._think_s > 0 else self._think_s
        heapq.heappush(self._ready, (ended + float(think), client))


def _sent_at(request: Request, at: float) -> Request:
    """``request`` arriving at ``at``; a prompt's known token-id bounds stay known (no pass over it)."""
    sent = replace(request, arrival_time=at)
    if "token_id_bounds" in request.__dict__:
        sent.__dict__["token_id_bounds"] = request.__dict__["token_id_bounds"]
    return sent


def is_closed_loop(workload_cfg) -> bool:
    arrival = workload_cfg.get("arrival") if hasattr(workload_cfg, "get") else getattr(workload_cfg, "arrival", None)
    return getattr(arrival, "value", arrival) == "closed_loop"


def workload_concurrency(workload_cfg) -> int | None:
    """``summary.json``'s ``concurrency``: the closed-loop clients, None (null) for open-loop arrivals."""
    return int(workload_cfg.concurrency) if is_closed_loop(workload_cfg) else None


def check_arrivals(workload_cfg) -> None:
    """``workload.time_scale`` (> 0: it multiplies every arrival time), and ``workload.concurrency`` /
    ``think_time_s`` / ``think_time_dist`` against ``workload.arrival``: each mistake one
    :class:`ConfigError` line naming the key."""
    time_scale = workload_cfg.get("time_scale", 1.0)
    if time_scale <= 0:
        raise ConfigError(f"workload.time_scale={time_scale} must be > 0: it multiplies every arrival time (0.5 = "
                          "twice as fast); for every request at once use workload.arrival=all_at_once")
    concurrency = workload_cfg.get("concurrency")
    if not is_closed_loop(workload_cfg):
        if concurrency is not None:
            raise ConfigError(f"workload.concurrency={concurrency} applies only to workload.arrival=closed_loop "
                              f"(workload.arrival={getattr(workload_cfg.get('arrival'), 'value', None)})")
        return
    if concurrency is None:
        raise ConfigError("workload.arrival=closed_loop needs workload.concurrency=N (the number of clients, >= 1)")
    if concurrency < 1:
        raise ConfigError(f"workload.concurrency={concurrency} must be >= 1 (the number of closed-loop clients)")
    if workload_cfg.think_time_s < 0:
        raise ConfigError(f"workload.think_time_s={workload_cfg.think_time_s} must be >= 0")
    dist = getattr(workload_cfg.think_time_dist, "value", workload_cfg.think_time_dist)
    if dist not in THINK_TIME_DISTS:
        raise ConfigError(f"workload.think_time_dist={dist!r} is not one of {list(THINK_TIME_DISTS)}")
    if workload_cfg.time_scale != 1.0:
        raise ConfigError(f"workload.time_scale={workload_cfg.time_scale}: closed-loop arrivals are the clients' "
                          "send times; time_scale applies to open-loop arrivals only (leave it at 1.0)")


def arrival_source(workload_cfg, requests: Iterable[Request]) -> OpenLoop | ClosedLoop:
    """The source ``workload_cfg`` asks for, over ``requests`` (checked by :func:`check_arrivals`)."""
    check_arrivals(workload_cfg)
    if not is_closed_loop(workload_cfg):
        return OpenLoop(requests, workload_cfg.time_scale)
    dist = getattr(workload_cfg.think_time_dist, "value", workload_cfg.think_time_dist)
    return ClosedLoop(requests, int(workload_cfg.concurrency), float(workload_cfg.think_time_s), dist,
                      int(workload_cfg.seed))
