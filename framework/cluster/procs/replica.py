"""The parent's record of one engine process of a wall-clock cluster (:mod:`servelab.cluster.procs.cluster`):
the router's counts, the gauges the replica last reported, and the figures ``per_replica`` reports."""

from __future__ import annotations

import signal
from dataclasses import dataclass, field
from typing import Any

from servelab.cluster.replica import RouterCounts, request_fits
from servelab.core.interfaces import EngineLimits, ReplicaView
from servelab.core.request import Request, Sequence
from servelab.results.replica_report import ReplicaReport


class ReplicaProcessError(RuntimeError):
    """A replica's process failed or died: one line naming it."""


@dataclass
class ProcReplica(RouterCounts):
    """An engine process as the parent knows it: the router's counts
    (:class:`~servelab.cluster.replica.RouterCounts`) and the gauges the replica last reported."""

    index: int
    role: str
    process: Any
    inbox: Any  # parent -> child: a queue
    conn: Any  # child -> parent: the reading end of its pipe
    tensor_parallel_size: int = 1
    hardware: str = "this machine"
    limits: EngineLimits | None = None
    num_kv_blocks: int = 0
    gauges: tuple[int, int, float] = (0, 0, 0.0)  # waiting, running, KV utilisation after its last step
    report: ReplicaReport | None = None
    closed: bool = False  # its pipe reached end-of-file (the process exited)
    live: dict[str, Sequence] = field(default_factory=dict)  # placed here, not ended (unfinished if the run stops)

    def can_hold(self, request: Request, tokens: int | None = None) -> bool:
        """Whether the request fits this replica's pool at all (paged arithmetic on the limits it sent;
        the engine itself rejects, with its reason, what it can never hold)."""
        limits = self.limits
        assert limits is not None  # it reported ready
        return request_fits(request, limits, lambda n: -(-n // limits.block_size) <= self.num_kv_blocks, tokens)

    def view(self, can_hold: bool) -> ReplicaView:
        waiting, running, kv = self.gauges
        assert self.limits is not None
        return ReplicaView(index=self.index, role=self.role, can_hold=can_hold, num_outstanding=self.placed - self.ended,
                           outstanding_tokens=self.placed_tokens - self.ended_tokens, num_waiting=waiting,
                           num_running=running, kv_utilization=kv, num_kv_blocks=self.num_kv_blocks,
                           block_size=self.limits.block_size, tensor_parallel_size=self.tensor_parallel_size)


def exit_text(code: int | None) -> str:
    """How a process ended, in words (``killed by SIGKILL``, ``exit code 1``)."""
    if code is None:
        return "still running"
    if code < 0:
        return f"killed by {signal.Signals(-code).name}"
    return f"exit code {code}"
