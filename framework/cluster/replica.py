"""One replica of a cluster: an engine with its own stack and clock, and what a router may see of it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from servelab.core.interfaces import EngineLimits, ReplicaView
from servelab.core.request import Request, Sequence
from servelab.engine.engine import Engine

ROLES = ("mixed", "prefill", "decode")


@dataclass(kw_only=True)
class RouterCounts:
    """What a router process knows of a replica by itself: the requests (and their prompt + max_tokens)
    it placed there and saw end, and the figures ``per_replica`` reports. Both kinds of cluster keep
    these: the simulator's :class:`Replica` and the wall-clock cluster's record of an engine process."""

    placed: int = 0
    placed_tokens: int = 0
    ended: int = 0
    ended_tokens: int = 0
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0
    output_tokens: int = 0

    def place(self, request: Request) -> None:
        self.placed += 1
        self.placed_tokens += request.prompt_len + request.max_tokens

    def end(self, request: Request) -> None:
        self.ended += 1
        self.ended_tokens += request.prompt_len + request.max_tokens

    def count_end(self, request: Request, seq: Sequence, handed_on: bool = False) -> None:
        """``request`` ended here as ``seq``: the router's count, and the figures. ``handed_on``: its
        prompt was computed (and counted) on a prefill replica, whose first token ``seq`` carries."""
        self.end(request)
        self.output_tokens += seq.num_output_tokens - (1 if handed_on else 0)
        if not handed_on:
            self.prompt_tokens += request.prompt_len
            self.cached_prompt_tokens += seq.num_cached_prompt_tokens


def request_fits(request: Request, limits: EngineLimits, can_ever_fit: Callable[[int], bool],
                 tokens: int | None = None) -> bool:
    """Whether ``tokens`` (default prompt + max_tokens) of ``request`` fit an engine of ``limits`` whose
    pool can ever hold ``n`` tokens when ``can_ever_fit(n)``."""
    prompt = request.prompt_len
    if prompt == 0 or request.max_tokens < 1 or prompt >= limits.max_model_len:
        return False
    return can_ever_fit(min(prompt + request.max_tokens if tokens is None else tokens, limits.max_model_len))


@dataclass
class Replica(RouterCounts):
    """An engine in a cluster, with the router's own counts of what it placed there.

    ``gpu_offset``: the first of its ``tensor_parallel_size`` GPUs, numbered across the cluster
    (which node it is on decides the link a KV transfer crosses). The gauges a router reads are
    taken at each step boundary: while a step is under way (the replica's clock is past the
    arrival being routed) the router sees the ones from the step's start.
    """

    index: int
    role: str
    engine: Engine
    tensor_parallel_size: int = 1
    hardware: str = ""
    gpu_offset: int = 0
    stalled: bool = False  # its last step found nothing to run: wait for something to change
    _gauges_at_step_start: tuple = field(default=(0, 0, 0, 0.0), repr=False)  # (ended, ended_tokens, queues, kv)

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"replica role {self.role!r} is not one of {ROLES}")

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
        """Whether ``tokens`` (default prompt + max_tokens) of ``request`` fit this replica at all."""
        return request_fits(request, self.engine.limits, self.engine.allocator.can_ever_fit, tokens)

    def mark_step_start(self) -> None:
        """Keep the gauges a router may read while the coming step is under way."""
        self._gauges_at_step_start = (self.ended, self.ended_tokens, *self._live_gauges())

    def view(self, at: float, can_hold: bool) -> ReplicaView:
        """What a router sees of this replica at ``at``."""
        if self.engine.now() <= at:
            ended, ended_tokens, queues, kv = self.ended, self.ended_tokens, *self._live_gauges()
        else:
            ended, ended_tokens, queues, kv = self._gauges_at_step_start
        allocator = self.engine.allocator
        return ReplicaView(index=self.index, role=self.role, can_hold=can_hold, num_outstanding=self.placed - ended,
                           outstanding_tokens=self.placed_tokens - ended_tokens, num_waiting=queues[0],
                           num_running=queues[1], kv_utilization=kv, num_kv_blocks=allocator.num_blocks,
                           block_size=self.engine.limits.block_size, tensor_parallel_size=self.tensor_parallel_size)

    def _live_gauges(self) -> tuple[tuple[int, int], float]:
        queues = self.engine.scheduler.queue_lengths()
        allocator = self.engine.allocator
        waiting = queues.get("waiting", 0) + queues.get("swapped", 0)
        return (waiting, queues.get("running", 0)), allocator.num_used_blocks() / max(1, allocator.num_blocks)
