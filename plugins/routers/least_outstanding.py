"""``router=least_outstanding``: each request to the replica with the least outstanding work.

Outstanding work is what the router itself placed on a replica and has not yet seen finish: by
default the number of requests (``num_outstanding``), with ``router.by=tokens`` their prompt plus
``max_tokens`` summed (``outstanding_tokens``). This is the "least requests" / "least load" policy
of production routers (vLLM production-stack's router, llm-d's load-aware scorer, Envoy's
least-request balancer): cheap, and blind to prompt overlap. Ties go to the lowest index, and only
replicas that can hold the request are considered.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from servelab.plugin_api import ReplicaView, Request, Router

LOADS = ("requests", "tokens")


def load_of(by: str) -> Callable[[ReplicaView], int]:
    """The load gauge ``by`` names ("requests": ``num_outstanding``, "tokens": ``outstanding_tokens``);
    a ValueError naming ``router.by`` for anything else."""
    if by == "requests":
        return lambda view: view.num_outstanding
    if by == "tokens":
        return lambda view: view.outstanding_tokens
    raise ValueError(f"router.by={by!r} must be one of {', '.join(map(repr, LOADS))}")


def least_loaded(replicas: Sequence[ReplicaView], load: Callable[[ReplicaView], int]) -> int:
    """The index of the least loaded replica that can hold the request (ties: the lowest index)."""
    return min((v for v in replicas if v.can_hold), key=lambda v: (load(v), v.index)).index


@dataclass
class LeastOutstandingConfig:
    by: str = "requests"  # "requests" (num_outstanding) or "tokens" (their prompt + max_tokens)


class LeastOutstandingRouter(Router):
    """The replica with the fewest outstanding requests (or tokens), ties to the lowest index."""

    name = "least_outstanding"
    Config = LeastOutstandingConfig

    def __init__(self, config: LeastOutstandingConfig, context) -> None:
        super().__init__(config, context)
        self.load = load_of(config.by)

    def route(self, request: Request, replicas: Sequence[ReplicaView], now: float) -> int:
        return least_loaded(replicas, self.load)
