"""``migration_policy=drain``: moves requests off draining replicas only (scale-down, a rolling restart).

Each interval, every draining replica sends up to ``per_replica`` of its running requests (counting
those already on their way), smallest KV first, each to the replica that is not draining with the
most free blocks and room for it (its blocks now plus ``margin_blocks`` to grow). A request that
fits nowhere stays and finishes where it is. Nothing moves while no replica drains.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from servelab.plugin_api import Migrate, MigrationPolicy, ReplicaLoad, RequestLoad


@dataclass
class DrainConfig:
    per_replica: int = 2  # migrations under way at once from one draining replica
    margin_blocks: int = 1  # a target keeps this many blocks free beyond the request's, to grow into


def by_cost(requests: Sequence[RequestLoad]) -> list[RequestLoad]:
    """Running requests not migrating, cheapest to move first (fewest blocks; ties: id)."""
    return sorted((q for q in requests if not q.migrating), key=lambda q: (q.num_blocks, q.id))


class DrainPolicy(MigrationPolicy):
    """Empties draining replicas onto the others."""

    name = "drain"
    Config = DrainConfig

    def __init__(self, config: DrainConfig, context) -> None:
        super().__init__(config, context)
        if config.per_replica < 1:
            raise ValueError(f"migration_policy.per_replica={config.per_replica} must be >= 1")
        if config.margin_blocks < 0:
            raise ValueError(f"migration_policy.margin_blocks={config.margin_blocks} must be >= 0")

    def decide(self, replicas: Sequence[ReplicaLoad], now: float) -> Sequence[Migrate]:
        free = {r.index: r.num_free_blocks for r in replicas if not r.draining}
        moves: list[Migrate] = []
        for source in (r for r in replicas if r.draining):
            for q in by_cost(source.running)[:max(0, self.config.per_replica - source.migrating_out)]:
                room = [i for i, f in free.items() if f >= q.needed_blocks + self.config.margin_blocks]
                if not room:
                    break
                target = max(room, key=lambda i: (free[i], -i))
                free[target] -= q.needed_blocks
                moves.append(Migrate(q.id, target))
        return moves
