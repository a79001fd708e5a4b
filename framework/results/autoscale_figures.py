"""A cluster's scaling, summed for ``summary.json`` (docs/metrics.md, "Autoscaling")."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class AutoscaleSums:
    """When each replica held its GPUs (``spans``: ``[index, from_s, to_s or None while held]``, from the
    scale-up decision, cold start included, to its retirement), the scaling events and the cold starts."""

    spans: list[list] = field(default_factory=list)
    scale_up_events: int = 0
    scale_down_events: int = 0
    cold_start_seconds: float = 0.0
    warm_starts: int = 0

    def hold(self, index: int, t: float) -> None:
        self.spans.append([index, t, None])

    def release(self, index: int, t: float) -> None:
        span = next(s for s in reversed(self.spans) if s[0] == index and s[2] is None)
        span[2] = t

    def replica_seconds(self, end_s: float) -> float:
        """Seconds of replicas holding GPUs up to ``end_s`` (the run's end; a span past it is cut there)."""
        return sum(max(0.0, min(end_s, end if end is not None else end_s) - start) for _, start, end in self.spans)

    def figures(self, end_s: float, gpus_per_replica: int) -> dict:
        """The summary's autoscaling keys, the run ending at ``end_s``."""
        seconds = self.replica_seconds(end_s)
        return {"replica_seconds": seconds, "gpu_hours": seconds * gpus_per_replica / 3600,
                "scale_up_events": self.scale_up_events, "scale_down_events": self.scale_down_events,
                "cold_start_seconds": self.cold_start_seconds, "warm_starts": self.warm_starts}
