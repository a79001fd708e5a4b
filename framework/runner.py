"""Drive an engine through a workload on its clock (arrival times honoured)."""

from __future__ import annotations

from typing import Callable, Iterable

from .engine import Engine
from .request import Request


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
    pending = sorted(requests, key=lambda r: r.arrival_time)
    next_index = 0
    reported = engine.num_ended
    engine.reset_clock()
    while next_index < len(pending) or engine.has_unfinished():
        now = engine.now()
        while next_index < len(pending) and pending[next_index].arrival_time * time_scale <= now:
            request = pending[next_index]
            engine.add_request(request, request.arrival_time * time_scale)
            next_index += 1
        record = engine.step() if engine.has_unfinished() else None
        if on_progress and engine.num_ended > reported:
            on_progress(engine.num_ended - reported)
            reported = engine.num_ended
        if record is not None:
            continue
        if next_index < len(pending):
            wait = pending[next_index].arrival_time * time_scale - engine.now()
            if wait > 0:
                sleep(wait)
        elif engine.has_unfinished():
            raise RuntimeError(f"scheduler {type(engine.scheduler).name!r} made no progress with "
                               f"{engine.scheduler.num_unfinished()} requests unfinished and nothing running "
                               f"(queues: {engine.scheduler.queue_lengths()})")
