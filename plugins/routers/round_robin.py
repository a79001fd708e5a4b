"""``router=round_robin``: each request to the next replica in turn that can hold it.

The baseline of every load balancer (nginx's and Kubernetes Services' default, vLLM
production-stack's ``roundrobin``): blind to load and to prompts, so it spreads requests evenly
and scatters the requests that share a prefix over every replica's cache.
"""

from __future__ import annotations

from collections.abc import Sequence

from servelab.plugin_api import ReplicaView, Request, Router


class RoundRobinRouter(Router):
    """Cycles through the offered replicas in index order, skipping any that cannot hold the
    request; a separate turn is kept per pool (prefill and decode pools each get their own cycle)."""

    name = "round_robin"

    def __init__(self, config, context) -> None:
        super().__init__(config, context)
        self._next: dict[str, int] = {}  # pool role -> the replica index whose turn it is

    def route(self, request: Request, replicas: Sequence[ReplicaView], now: float) -> int:
        role = replicas[0].role
        start = self._next.get(role, 0)
        # The first replica at or after `start` that can hold the request, wrapping around to the lowest index.
        chosen = min((v for v in replicas if v.can_hold), key=lambda v: (v.index < start, v.index))
        self._next[role] = chosen.index + 1
        return chosen.index
