"""Autoscaling on the simulator's cluster: the periodic question to the autoscaler, and each replica's
life (off, starting, serving, draining), driven on the cluster loop's virtual clock.

The cluster is built with ``cluster.max_replicas`` replicas; the first ``cluster.replicas`` serve
from the start, the others are off. Every ``cluster.autoscale_interval_s`` (while anything runs or
starts) the autoscaler (:mod:`servelab.core.autoscaler`) sees the replicas in service and answers;
each checked decision is carried out:

- **scale up**: the lowest-index off replicas start. One from the warm pool (``cluster.warm_pool``
  replicas standing by with their weights loaded) serves at once; any other after its cold start,
  its weights read at ``cluster.cold_start_gb_s``. A replica holds its GPUs (replica-seconds) from
  the decision on.
- **scale down**: the replica drains through the same books as ``cluster.draining``: the router
  offers it as full, and a migration policy (if one moves requests) sees it draining and moves its
  running requests away; without one they finish where they are. At the first question after it is
  empty (nothing queued or running, no migration from or to it) it is retired: off, its GPUs given
  back, and (with a warm pool not full) standing by in the pool.

A replica that is off or starting is offered to the router as full and to a migration policy as
draining, so nothing is placed or moved there.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from servelab.cluster.migration import replica_load
from servelab.cluster.replica import Replica
from servelab.core.autoscaler import AutoscaleView, Autoscaler, ScaleDown, ScaleUp, checked_decisions
from servelab.core.migration_policy import ReplicaLoad
from servelab.results.autoscale_figures import AutoscaleSums

if TYPE_CHECKING:
    from servelab.cluster.simulated import Cluster

STATES = ("off", "starting", "serving", "draining")


@dataclass(frozen=True)
class AutoscaleSettings:
    """The ``cluster.autoscale_*`` keys as the driver uses them: how often it asks, the initial size and
    the bounds, a cold start's seconds and the warm pool's size."""

    interval_s: float = 5.0
    initial: int = 1
    min_replicas: int = 1
    max_replicas: int = 1
    cold_start_s: float = 0.0
    warm_pool: int = 0
    gpus_per_replica: int = 0  # tensor_parallel_size x pipeline_parallel_size (0: the replica's tensor_parallel_size)


class AutoscaleDriver:
    """The cluster's scaling: asks ``autoscaler`` on the loop's clock, starts, drains and retires
    replicas, keeps the sums (:class:`AutoscaleSums`) and, per question, the replicas serving, starting
    and holding GPUs after it (``history``: ``(t, serving, starting, held)``)."""

    def __init__(self, cluster: "Cluster", autoscaler: Autoscaler, settings: AutoscaleSettings) -> None:
        if len(cluster.replicas) != settings.max_replicas:
            raise ValueError(f"an autoscaled cluster is built with max_replicas={settings.max_replicas} replicas, "
                             f"not {len(cluster.replicas)}")
        self.cluster = cluster
        self.autoscaler = autoscaler
        self.settings = settings
        self.sums = AutoscaleSums()
        self.history: list[tuple[float, int, int, int]] = []
        self.state = ["serving" if i < settings.initial else "off" for i in range(settings.max_replicas)]
        self._warm = settings.warm_pool
        self._ticking = False
        for i, state in enumerate(self.state):
            if state == "serving":
                self.sums.hold(i, 0.0)
            else:
                self._set_draining(i, True)

    def count(self, state: str) -> int:
        return self.state.count(state)

    def _set_draining(self, index: int, draining: bool) -> None:
        migration = self.cluster.migration
        if migration is not None:
            migration.set_draining(index, draining)
        elif draining:
            self.cluster.protocol.draining.add(index)
        else:
            self.cluster.protocol.draining.discard(index)

    # ---- the periodic question ------------------------------------------------------------------
    def arrived(self, t: float) -> None:
        """A request arrived at ``t``: if the autoscaler went quiet, it is asked again at the next
        multiple of the interval after ``t``."""
        if not self._ticking:
            self._ticking = True
            interval = self.settings.interval_s
            self._tick_at((math.floor(t / interval) + 1) * interval)

    def _tick_at(self, t: float) -> None:
        self.cluster._at(t, lambda: self._tick(t))

    def _tick(self, now: float) -> None:
        self._retire_empty(now)
        for decision in checked_decisions(self.autoscaler, self.view(now), now):
            if isinstance(decision, ScaleUp):
                self._scale_up(decision.count, now)
            else:
                assert isinstance(decision, ScaleDown)
                self._scale_down(decision.replica)
        starting = self.count("starting")
        self.history.append((now, self.count("serving"), starting, len(self.state) - self.count("off")))
        if starting or any(r.busy for r in self.cluster.replicas):
            self._tick_at(now + self.settings.interval_s)
        else:  # nothing runs: quiet until a request arrives (else the loop would never end)
            self._ticking = False

    def view(self, now: float) -> AutoscaleView:
        """What the autoscaler sees at ``now``."""
        migration = self.cluster.migration
        loads: list[ReplicaLoad] = (migration.loads() if migration is not None else
                                    [replica_load(r, (), self.state[r.index] == "draining")
                                     for r in self.cluster.replicas])
        in_service = tuple(load for load in loads if self.state[load.index] in ("serving", "draining"))
        s = self.settings
        replicas = [self.cluster.replicas[load.index] for load in in_service]
        return AutoscaleView(in_service, self.count("starting"), s.min_replicas, s.max_replicas,
                             tuple(self._first_token_wait(r, now) for r in replicas),
                             tuple(self._prefill_backlog(r) for r in replicas))

    @staticmethod
    def _prefill_backlog(r: Replica) -> int:
        """The tokens ``r`` must compute before each of its requests has its first token."""
        return sum(seq.num_tokens - seq.num_computed_tokens for seq in r.engine.sequences.values()
                   if not seq.is_finished and seq.num_output_tokens == 0)

    @staticmethod
    def _first_token_wait(r: Replica, now: float) -> float:
        """How long the request on ``r`` that has waited longest for its first token has waited at ``now``."""
        return max((now - seq.arrival_s for seq in r.engine.sequences.values()
                    if not seq.is_finished and seq.num_output_tokens == 0), default=0.0)

    # ---- a replica's life -----------------------------------------------------------------------
    def _scale_up(self, count: int, now: float) -> None:
        self.sums.scale_up_events += 1
        for index in [i for i, state in enumerate(self.state) if state == "off"][:count]:
            self.state[index] = "starting"
            self.sums.hold(index, now)
            if self._warm:
                self._warm -= 1
                self.sums.warm_starts += 1
                self._serve(index)
                continue
            cold = self.settings.cold_start_s
            self.sums.cold_start_seconds += cold
            self.cluster._at(now + cold, functools.partial(self._serve, index))

    def _serve(self, index: int) -> None:
        self.state[index] = "serving"
        self._set_draining(index, False)

    def _scale_down(self, index: int) -> None:
        self.sums.scale_down_events += 1
        self.state[index] = "draining"
        self._set_draining(index, True)

    def _retire_empty(self, now: float) -> None:
        migration = self.cluster.migration
        for r in self.cluster.replicas:
            if self.state[r.index] != "draining" or r.engine.has_unfinished():
                continue
            if migration is not None and migration.involves(r.index):
                continue
            self.state[r.index] = "off"
            self.sums.release(r.index, now)
            if self._warm < self.settings.warm_pool:
                self._warm += 1  # it keeps its weights loaded, standing by

    def figures(self, end_s: float) -> dict:
        """The summary's autoscaling keys, the run ending at ``end_s``."""
        gpus = self.settings.gpus_per_replica or self.cluster.replicas[0].tensor_parallel_size
        return self.sums.figures(end_s, gpus)
