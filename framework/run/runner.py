"""Drive an engine through a workload on its clock (arrival times honoured)."""

from __future__ import annotations

import logging
from typing import Callable, Iterable

from servelab.engine.engine import Engine
from servelab.core.request import Request

INF = float("inf")
log = logging.getLogger(__name__)


def run_workload(engine: Engine, requests: Iterable[Request], time_scale: float = 1.0,
                 on_progress: Callable[[int], None] | None = None,
                 sleep: Callable[[float], None] | None = None) -> None:
    """Feed requests as they arrive (``arrival_time * time_scale`` seconds after start) and step
    until every request has finished or been rejected. Idle waits go through ``sleep`` (default the
    engine's clock: a nap on the wall clock, a jump to the next arrival on a virtual one).
    ``on_progress(n)`` is told of each newly
    ended request. Raises whatever the engine raises (KeyboardInterrupt included); the engine's
    state then holds the partial results.
    """
    sleep = sleep or engine.sleep
    if getattr(requests, "in_arrival_order", False):
        pending = iter(requests)  # made as they are needed (a long synthetic workload)
    else:
        pending = iter(sorted(requests, key=lambda r: r.arrival_time))
    upcoming = next(pending, None)
    reported = engine.num_ended
    engine.reset_clock()
    while upcoming is not None or engine.has_unfinished():
        now = engine.now()
        while upcoming is not None and upcoming.arrival_time * time_scale <= now:
            engine.add_request(upcoming, upcoming.arrival_time * time_scale)
            upcoming = next(pending, None)
        record = engine.step() if engine.has_unfinished() else None
        if record is not None:  # the quiet steps before the next arrival, at once (sim.fast_forward)
            engine.fast_forward(upcoming.arrival_time * time_scale if upcoming is not None else INF)
        if on_progress and engine.num_ended > reported:
            on_progress(engine.num_ended - reported)
            reported = engine.num_ended
        if record is not None:
            continue
        if upcoming is not None:
            wait = upcoming.arrival_time * time_scale - engine.now()
            if wait > 0:
                sleep(wait)
        elif engine.has_unfinished():
            raise RuntimeError(f"scheduler {type(engine.scheduler).name!r} made no progress with "
                               f"{engine.scheduler.num_unfinished()} requests unfinished and nothing running "
                               f"(queues: {engine.scheduler.queue_lengths()})")
    if engine.num_fast_forwarded:
        log.info("fast-forward: %d of %d steps run without asking the policies (sim.fast_forward)",
                 engine.num_fast_forwarded, engine.totals.num_steps)
