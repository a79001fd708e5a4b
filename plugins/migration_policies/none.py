"""``migration_policy=none`` (the default): nothing moves; the cluster never asks, prices or connects
anything for migration, so a run is exactly the one without the kind."""

from __future__ import annotations

from collections.abc import Sequence

from servelab.plugin_api import Migrate, MigrationPolicy, ReplicaLoad


class NoMigration(MigrationPolicy):
    """Moves nothing."""

    name = "none"
    moves_requests = False

    def decide(self, replicas: Sequence[ReplicaLoad], now: float) -> Sequence[Migrate]:
        return ()
