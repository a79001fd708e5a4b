"""The parent's record of one engine process of a wall-clock cluster (:mod:`servelab.cluster.procs.cluster`):
the protocol's record of a replica (:class:`~servelab.cluster.protocol.ReplicaRecord`: the router's
counts, the gauges the replica last reported, the figures ``per_replica`` reports) and its process."""

from __future__ import annotations

import signal
from dataclasses import dataclass
from typing import Any

from servelab.cluster.protocol import ReplicaRecord, request_fits
from servelab.core.interfaces import EngineLimits
from servelab.core.migration_policy import ReplicaLoad
from servelab.core.request import Request
from servelab.results.replica_report import ReplicaReport


class ReplicaProcessError(RuntimeError):
    """A replica's process failed or died: one line naming it."""


@dataclass
class ProcReplica(ReplicaRecord):
    """An engine process as the parent knows it: the protocol's record of a replica, whose gauges
    are the ones the process reported after its last step, and the process and its pipes."""

    process: Any
    inbox: Any  # parent -> child: a queue
    conn: Any  # child -> parent: the reading end of its pipe
    hardware: str = "this machine"
    limits: EngineLimits | None = None
    num_kv_blocks: int = 0
    report: ReplicaReport | None = None
    closed: bool = False  # its pipe reached end-of-file (the process exited)
    load: ReplicaLoad | None = None  # its per-request loads after its last step (a cluster that migrates)

    def can_hold(self, request: Request, tokens: int | None = None) -> bool:
        """Whether the request fits this replica's pool at all (paged arithmetic on the limits it sent;
        the engine itself rejects, with its reason, what it can never hold)."""
        limits = self.limits
        assert limits is not None  # it reported ready
        return request_fits(request, limits, lambda n: -(-n // limits.block_size) <= self.num_kv_blocks, tokens)

    def context_length(self) -> int:
        assert self.limits is not None  # it reported ready
        return self.limits.max_model_len

    def kv_pool(self) -> tuple[int, int]:
        assert self.limits is not None
        return self.num_kv_blocks, self.limits.block_size


def exit_text(code: int | None) -> str:
    """How a process ended, in words (``killed by SIGKILL``, ``exit code 1``)."""
    if code is None:
        return "still running"
    if code < 0:
        return f"killed by {signal.Signals(-code).name}"
    return f"exit code {code}"
