"""Drive an engine through a workload on its clock (arrival times honoured)."""

from __future__ import annotations

import logging
from typing import Callable, Iterable

from servelab.engine.engine import Engine
from servelab.core.request import Request
from servelab.engine.arrival_source import ArrivalSource, OpenLoop

INF = float("inf")
log = logging.getLogger(__name__)


def run_workload(engine: Engine, requests: Iterable[Request], time_scale: float = 1.0,
                 on_progress: Callable[[int], None] | None = None,
                 sleep: Callable[[float], None] | None = None,
                 arrivals: ArrivalSource | None = None) -> None:
    """Feed requests as they arrive (``arrival_time * time_scale`` seconds after start, or as
    ``arrivals`` says: a :class:`~servelab.workloads.arrivals.ClosedLoop` over ``requests``) and step
    until every request has finished or been rejected. Idle waits go through ``sleep`` (default the
    engine's clock: a nap on the wall clock, a jump to the next arrival on a virtual one).
    ``on_progress(n)`` is told of each newly
    ended request. Raises whatever the engine raises (KeyboardInterrupt included); the engine's
    state then holds the partial results.
    """
    sleep = sleep or engine.sleep
    source = arrivals if arrivals is not None else OpenLoop(requests, time_scale)
    stop_after_end = source.stops_spans_at_ends
    reported = engine.num_ended
    engine.reset_clock()
    engine.end_listeners.append(source.on_end)
    try:
        while not source.exhausted or engine.has_unfinished():
            now = engine.now()
            due = source.pop_due(now)
            while due is not None:
                engine.add_request(*due)
                due = source.pop_due(now)
            record = engine.step() if engine.has_unfinished() else None
            if record is not None:  # the quiet steps before the next arrival, at once (sim.fast_forward)
                engine.fast_forward(source.next_time(), stop_after_end=stop_after_end)
            if on_progress and engine.num_ended > reported:
                on_progress(engine.num_ended - reported)
                reported = engine.num_ended
            if record is not None:
                continue
            upcoming = source.next_time()
            if upcoming < INF:
                wait = upcoming - engine.now()
                if wait > 0:
                    sleep(wait)
            elif engine.has_unfinished():
                raise RuntimeError(f"scheduler {type(engine.scheduler).name!r} made no progress with "
                                   f"{engine.scheduler.num_unfinished()} requests unfinished and nothing running "
                                   f"(queues: {engine.scheduler.queue_lengths()})")
            elif not source.exhausted:  # a closed-loop client waits for a request the engine never ended
                raise RuntimeError("arrivals stopped with requests left to send and none in flight")
    finally:  # a kept span's sequences (a run that raised) are written as they are
        engine.settle_span()
        engine.end_listeners.remove(source.on_end)
    if engine.num_fast_forwarded:
        log.info("fast-forward: %d of %d steps run without asking the policies (sim.fast_forward)",
                 engine.num_fast_forwarded, engine.totals.num_steps)
