"""The live migrations of a cluster run, summed for ``summary.json`` (docs/metrics.md, "Migration")."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import numpy as np


@dataclass
class MigrationRecord:
    """One migration that completed: its request, replicas, the tokens whose KV moved, the bytes
    copied (pre-copy stages and stop-and-copy), the pre-copy stages, when it started, when the
    request stopped on its source and when its last copy landed (the downtime is between)."""

    request_id: str
    source: int
    target: int
    num_tokens: int
    nbytes: float
    num_stages: int
    start_s: float
    stop_s: float
    land_s: float

    @property
    def downtime_s(self) -> float:
        return self.land_s - self.stop_s


@dataclass
class MigrationSums:
    """Every completed migration (:class:`MigrationRecord`) and the aborted ones, by reason."""

    done: list[MigrationRecord] = field(default_factory=list)
    aborted: Counter = field(default_factory=Counter)

    def figures(self) -> dict:
        """The summary's migration keys."""
        downtimes = np.array([m.downtime_s for m in self.done]) * 1e3
        pct = ({"p50": float(np.percentile(downtimes, 50)), "p99": float(np.percentile(downtimes, 99)),
                "mean": float(downtimes.mean()), "max": float(downtimes.max())} if len(downtimes) else {})
        return {"num_migrations": len(self.done),
                "num_requests_migrated": len({m.request_id for m in self.done}),
                "migrated_bytes": float(sum(m.nbytes for m in self.done)),
                "migration_downtime_ms": pct,
                "num_aborted_migrations": sum(self.aborted.values()),
                "aborted_migrations": dict(sorted(self.aborted.items()))}
