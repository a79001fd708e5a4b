"""One replica of a cluster: an engine with its own stack and clock, and what a router may see of it."""

from __future__ import annotations

from dataclasses import dataclass, field

from servelab.core.interfaces import ReplicaView
from servelab.core.request import Request
from servelab.engine.engine import Engine

ROLES = ("mixed", "prefill", "decode")


@dataclass
class Replica:
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
    # the router's counts: requests (and their prompt + max_tokens) placed here, and ended here
    placed: int = 0
    placed_tokens: int = 0
    ended: int = 0
    ended_tokens: int = 0
    # the figures per_replica reports
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0
    output_tokens: int = 0
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
        limits = self.engine.limits
        prompt = request.prompt_len
        if prompt == 0 or request.max_tokens < 1 or prompt >= limits.max_model_len:
            return False
        needed = min(prompt + request.max_tokens if tokens is None else tokens, limits.max_model_len)
        return self.engine.allocator.can_ever_fit(needed)

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

    def place(self, request: Request) -> None:
        self.placed += 1
        self.placed_tokens += request.prompt_len + request.max_tokens

    def end(self, request: Request) -> None:
        self.ended += 1
        self.ended_tokens += request.prompt_len + request.max_tokens
