"""``router=session``: every request of a client (conversation, session) to the same replica.

Session affinity ("sticky sessions"), as vLLM production-stack's session router and llm-d's
session-affinity scorer do it with a session header: the workload sets ``request.client_id`` to the
conversation's id, so a follow-up turn lands where its history is already in the prefix cache.
A client's first request goes to the least loaded replica that can hold it (``router.by``:
outstanding requests or tokens), and sticks there; a later request goes to the same replica while
that one can hold it, else it is placed afresh and the client sticks to the new replica.
``client_id=None`` (anonymous) is placed by load alone and sticks nowhere. Prefill and decode
pools number their replicas apart, so a client sticks once per pool role.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from servelab.plugin_api import ReplicaView, Request, Router
from servelab.plugins.routers.least_outstanding import least_loaded, load_of


@dataclass
class SessionConfig:
    by: str = "requests"  # how a new (or re-placed) client's replica is chosen: "requests" or "tokens"


class SessionRouter(Router):
    """Sticky by ``client_id`` per pool role; new clients to the least loaded replica."""

    name = "session"
    Config = SessionConfig

    def __init__(self, config: SessionConfig, context) -> None:
        super().__init__(config, context)
        self.load = load_of(config.by)
        # (pool role, client id) -> replica index; kept after requests finish: the client's history
        # stays in that replica's cache, which is the point of sticking.
        self.sticky: dict[tuple[str, str], int] = {}

    def route(self, request: Request, replicas: Sequence[ReplicaView], now: float) -> int:
        if request.client_id is None:
            return least_loaded(replicas, self.load)
        key = (replicas[0].role, request.client_id)
        held = self.sticky.get(key)
        if held is not None and any(v.index == held and v.can_hold for v in replicas):
            return held
        chosen = self.sticky[key] = least_loaded(replicas, self.load)
        return chosen
