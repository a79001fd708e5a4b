"""One replica of the simulator's cluster: an engine with its own stack and clock, and the protocol's
record of it (:class:`~servelab.cluster.protocol.ReplicaRecord`: the router's counts, what a router sees)."""

from __future__ import annotations

from dataclasses import dataclass, field

from servelab.cluster.protocol import ROLES, Gauges, ReplicaRecord, RouterCounts, request_fits
from servelab.core.request import Request
from servelab.engine.engine import Engine

__all__ = ["ROLES", "Replica", "RouterCounts", "request_fits"]


@dataclass
class Replica(ReplicaRecord):
    """An engine in the simulator's cluster, with the router's own counts of what it placed there.

    ``gpu_offset``: the first of its ``tensor_parallel_size`` GPUs, numbered across the cluster
    (which node it is on decides the link a KV transfer crosses). The gauges a router reads are
    taken at each step boundary: while a step is under way (the replica's clock is past the
    arrival being routed) the router sees the ones from the step's start.
    """

    engine: Engine
    hardware: str = ""
    gpu_offset: int = 0
    stalled: bool = False  # its last step found nothing to run: wait for something to change
    _ended_at_step_start: tuple[int, int] = field(default=(0, 0), repr=False)  # (ended, ended_tokens)

    @property
    def now(self) -> float:
        return self.engine.now()

    @property
    def busy(self) -> bool:
        """Has work its next step could do (a stalled replica waits for an arrival or a transfer)."""
        return not self.stalled and self.engine.has_unfinished()

    def wake(self, at: float) -> None:
        """Something arrived for this replica at ``at``: an idle clock catches up to it."""
        self.stalled = False
        if self.engine.now() < at:
            self.engine.sleep(at - self.engine.now())

    def can_hold(self, request: Request, tokens: int | None = None) -> bool:
        return request_fits(request, self.engine.limits, self.engine.allocator.can_ever_fit, tokens)

    def context_length(self) -> int:
        return self.engine.limits.max_model_len

    def kv_pool(self) -> tuple[int, int]:
        return self.engine.allocator.num_blocks, self.engine.limits.block_size

    def mark_step_start(self) -> None:
        """Keep what a router may read while the coming step is under way: the gauges it reports."""
        self._ended_at_step_start = (self.ended, self.ended_tokens)
        self.gauges = Gauges.of(self.engine)

    def seen(self, at: float) -> tuple[int, int, Gauges]:
        if self.engine.now() <= at:
            return self.ended, self.ended_tokens, Gauges.of(self.engine)
        return *self._ended_at_step_start, self.gauges
