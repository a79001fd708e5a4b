"""The arrival sources a driver (:func:`servelab.run.runner.run_workload`, :meth:`servelab.cluster.
cluster.Cluster.run`) feeds from: their shape (:class:`ArrivalSource`) and the open-loop one, the
requests at their own times. Closed-loop clients are :class:`servelab.workloads.arrivals.ClosedLoop`;
a front end's request delay wraps either (:class:`servelab.engine.frontend.DelayedArrivals`)."""

from __future__ import annotations

from typing import Iterable, Iterator, Protocol, runtime_checkable

from servelab.core.request import Request, Sequence

INF = float("inf")


@runtime_checkable
class ArrivalSource(Protocol):
    """Where a driver's requests come from: it asks for the requests due by ``now``
    (:meth:`pop_due`, with their arrival in engine seconds), the time of the next known arrival
    (:meth:`next_time`, inf when none is known), whether any are left (:attr:`exhausted`), and
    tells the source of every request that ends (:meth:`on_end`). A source whose arrivals depend
    on ends (``stops_spans_at_ends``) needs fast-forward spans to stop after a step in which a
    request ended."""

    @property
    def stops_spans_at_ends(self) -> bool: ...

    @property
    def concurrency(self) -> int | None: ...

    @property
    def exhausted(self) -> bool: ...

    def next_time(self) -> float: ...

    def pop_due(self, now: float) -> tuple[Request, float] | None: ...

    def on_end(self, seq: Sequence) -> None: ...


class OpenLoop:
    """The requests at their own ``arrival_time * time_scale`` (engine seconds), in arrival order."""

    stops_spans_at_ends = False
    concurrency = None

    def __init__(self, requests: Iterable[Request], time_scale: float = 1.0) -> None:
        if getattr(requests, "in_arrival_order", False):
            self._pending: Iterator[Request] = iter(requests)  # made as they are needed (a long synthetic workload)
        else:
            self._pending = iter(sorted(requests, key=lambda r: r.arrival_time))
        self._time_scale = time_scale
        self._upcoming = next(self._pending, None)

    @property
    def exhausted(self) -> bool:
        return self._upcoming is None

    def next_time(self) -> float:
        upcoming = self._upcoming
        return INF if upcoming is None else upcoming.arrival_time * self._time_scale

    def pop_due(self, now: float) -> tuple[Request, float] | None:
        """The next request if it has arrived by ``now``, with its arrival (engine seconds); else None."""
        upcoming = self._upcoming
        if upcoming is None or upcoming.arrival_time * self._time_scale > now:
            return None
        self._upcoming = next(self._pending, None)
        return upcoming, upcoming.arrival_time * self._time_scale

    def on_end(self, seq: Sequence) -> None:
        """Open-loop arrivals do not depend on ends."""
