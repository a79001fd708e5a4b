"""A read-only probe of a simulated cluster's KV fragmentation across replicas (Llumnix's case).

Llumnix (Sun et al., OSDI '24, section 2) calls the cluster's free KV *fragmented* when a queued
request waits although the free blocks of all replicas together would hold it: it fits on no
single replica. :class:`FragmentationProbe` samples every ``interval_s`` of the cluster's clock
(events on the loop, the same clock as every step) and counts, over every request queued on a
replica (waiting, not running) that does not fit in its own replica's free blocks:

- ``fragmented``: it fits on no replica but in the sum of all replicas' free blocks;
- ``stranded``: it fits on another replica (a placement the router could have done better).

A request's need is the blocks of its tokens plus one, less the blocks it already holds. The
probe only reads; it is attached by a study (``experiments/migration/study.py``, through
``run_cluster_job(..., probe=...)``), never by a config, so runs without it are unchanged. Its events end fast-forward spans early (CPU, not
results: spans give identical results).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from servelab.core.request import Status

if TYPE_CHECKING:
    from servelab.cluster.simulated import Cluster


@dataclass
class FragmentationSums:
    """What the probe saw: samples taken, and per kind the samples with one or more such requests
    and the request-samples (times ``interval_s``: request-seconds)."""

    interval_s: float
    samples: int = 0
    queued_request_samples: int = 0
    fragmented_samples: int = 0
    fragmented_request_samples: int = 0
    stranded_samples: int = 0
    stranded_request_samples: int = 0
    per_sample: list[tuple[float, int, int]] = field(default_factory=list)  # (t, fragmented, stranded) if kept

    def as_dict(self) -> dict:
        dt, n = self.interval_s, max(1, self.samples)
        return {"interval_s": dt, "samples": self.samples,
                "queued_request_s": self.queued_request_samples * dt,
                "fragmented_time_share": self.fragmented_samples / n,
                "fragmented_request_s": self.fragmented_request_samples * dt,
                "stranded_time_share": self.stranded_samples / n,
                "stranded_request_s": self.stranded_request_samples * dt}


class FragmentationProbe:
    """Samples ``cluster`` every ``interval_s`` from ``interval_s`` until its last arrival
    (``until_s``) and then while any replica has work; call :meth:`attach` before ``cluster.run``."""

    def __init__(self, cluster: Cluster, interval_s: float = 0.1, until_s: float = 0.0, keep: bool = False) -> None:
        if interval_s <= 0:
            raise ValueError(f"the fragmentation probe's interval_s={interval_s} must be positive")
        self.cluster, self.until_s, self.keep = cluster, until_s, keep
        self.sums = FragmentationSums(interval_s)

    def attach(self) -> None:
        self._next(0.0)

    def _next(self, t: float) -> None:
        at = t + self.sums.interval_s
        self.cluster._at(at, lambda: self._sample(at))

    def _sample(self, t: float) -> None:
        fragmented, stranded, queued = self.count()
        s = self.sums
        s.samples += 1
        s.queued_request_samples += queued
        s.fragmented_samples += fragmented > 0
        s.fragmented_request_samples += fragmented
        s.stranded_samples += stranded > 0
        s.stranded_request_samples += stranded
        if self.keep:
            s.per_sample.append((t, fragmented, stranded))
        replicas = self.cluster.replicas
        if (t < self.until_s or any(r.busy for r in replicas)
                or (self.cluster._events and any(r.engine.has_unfinished() for r in replicas))):
            self._next(t)

    def count(self) -> tuple[int, int, int]:
        """(fragmented, stranded, queued) requests now."""
        free = [r.engine.allocator.num_free_blocks() for r in self.cluster.replicas]
        total, fragmented, stranded, queued = sum(free), 0, 0, 0
        for i, r in enumerate(self.cluster.replicas):
            allocator, block_size = r.engine.allocator, r.engine.limits.block_size
            for seq in r.engine.sequences.values():
                if seq.status is not Status.WAITING:
                    continue
                queued += 1
                need = -(-(seq.num_tokens + 1) // block_size) - len(allocator.block_table(seq.id))
                if need <= free[i]:
                    continue
                if any(need <= f for j, f in enumerate(free) if j != i):
                    stranded += 1
                elif need <= total:
                    fragmented += 1
        return fragmented, stranded, queued
