"""``migration_policy=llumnix``: Llumnix's virtual usage (Sun et al., OSDI '24, section 4.4).

One load figure per replica unifies the policy's goals. A replica's *virtual usage* (in KV blocks)
is its physical usage plus what it should keep free:

- **de-fragmentation**: the blocks its head-of-line queued request needs (a request that fits on no
  replica as they are makes its replica look full, so running requests leave it and it can start);
- **priorities**: ``headroom_fraction`` of the pool while it runs a high-priority request
  (``priority < high_priority_below``; lower is more urgent, as ``scheduler=priority``);
- **draining**: infinite (everything leaves).

Its *freeness* is ``(num_kv_blocks - virtual usage) / running requests`` (the paper's
``F = (M - sum V) / B``): blocks of headroom per running request. Every interval the replicas with
freeness below ``source_below`` (and draining ones) are paired, lowest first, with those above
``target_above``, highest first; each pair moves one running request (the least urgent, then the
fewest blocks) that the target has room for. A replica with a migration under way is left out of
this round (``concurrent=false``, the default; Llumnix migrates one request per pair at a time).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from servelab.plugin_api import Migrate, MigrationPolicy, ReplicaLoad, RequestLoad


@dataclass
class LlumnixConfig:
    source_below: float = 1.0  # freeness (blocks per running request) under which a replica sends
    target_above: float = 8.0  # freeness over which a replica receives
    headroom_fraction: float = 0.1  # of the pool, kept free on a replica running a high-priority request
    high_priority_below: int = 0  # a request with priority below this is high priority
    concurrent: bool = False  # a replica may send or receive while a migration of it is under way


def virtual_usage(replica: ReplicaLoad, config: LlumnixConfig) -> float:
    """Blocks in use, plus the head-of-line demand and the priority headroom; infinite when draining."""
    if replica.draining:
        return math.inf
    usage = float(replica.num_used_blocks)
    if replica.waiting:
        usage += replica.waiting[0].needed_blocks
    if any(q.priority < config.high_priority_below for q in replica.running):
        usage += config.headroom_fraction * replica.num_kv_blocks
    return usage


def freeness(replica: ReplicaLoad, config: LlumnixConfig) -> float:
    """Blocks of headroom per running request (``-inf`` when draining)."""
    return (replica.num_kv_blocks - virtual_usage(replica, config)) / max(1, replica.num_running)


def candidate(requests: Sequence[RequestLoad], room: int) -> RequestLoad | None:
    """The request to move: not migrating, fits in ``room`` blocks, least urgent, then fewest blocks."""
    fitting = [q for q in requests if not q.migrating and q.needed_blocks + 1 <= room]
    return max(fitting, key=lambda q: (q.priority, -q.num_blocks, q.id), default=None)


class LlumnixPolicy(MigrationPolicy):
    """Pairs the least free replicas with the freest, one request per pair per interval."""

    name = "llumnix"
    Config = LlumnixConfig

    def __init__(self, config: LlumnixConfig, context) -> None:
        super().__init__(config, context)
        if not config.source_below < config.target_above:
            raise ValueError(f"migration_policy.source_below={config.source_below} must be below "
                             f"migration_policy.target_above={config.target_above}")
        if not 0.0 <= config.headroom_fraction < 1.0:
            raise ValueError(f"migration_policy.headroom_fraction={config.headroom_fraction} must be in [0, 1)")

    def decide(self, replicas: Sequence[ReplicaLoad], now: float) -> Sequence[Migrate]:
        config = self.config
        free = {r.index: freeness(r, config) for r in replicas}
        idle = [r for r in replicas if config.concurrent or (r.migrating_in == 0 and r.migrating_out == 0)]
        sources = sorted((r for r in idle if free[r.index] < config.source_below and r.running),
                         key=lambda r: (free[r.index], r.index))
        targets = sorted((r for r in idle if not r.draining and free[r.index] > config.target_above),
                         key=lambda r: (-free[r.index], r.index))
        moves = []
        for source, target in zip(sources, targets):
            q = candidate(source.running, target.num_free_blocks)
            if q is not None:
                moves.append(Migrate(q.id, target.index))
        return moves
