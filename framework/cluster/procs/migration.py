"""Live migration between engine processes: the parent's side (the children's is
:mod:`servelab.cluster.procs.migrate_child`, the bytes' :mod:`servelab.kv.migrate_proc`).

Every ``cluster.migration_interval_s`` of the wall clock, while requests are outstanding, the
migration policy sees one :class:`ReplicaLoad` per replica (the per-request loads each process
reported after its last step, as :func:`servelab.cluster.migration.engine_load` builds them, kept to
the requests the protocol places there, with the parent's draining and migrating flags) and each
checked decision starts a migration of a decoding request from its replica (the source) to the target:

1. **pre-copy**, while the request keeps decoding on the source: the source reads the KV of its
   computed tokens since the last stage out of its pool between two steps and sends it (a host
   tensor: shared memory through the parent's pipes and queues); the target keeps it in host memory
   and holds blocks for it in its allocator (under a shadow id, as the simulator's target does).
   Stage 0 reads everything; once a stage brought at most ``cluster.migration_stop_blocks`` blocks
   (or after ``migration_max_stages``; at once with ``migration_precopy=false``) the next read stops;
2. **stop-and-copy**: the source reads the last tokens, ends the request there (``Engine.abort``,
   not reported as an end; its blocks are free, the bytes are in the message) and sends the sequence;
   the protocol moves it (:meth:`ClusterProtocol.migrate`) and the target is given the continuation
   and the whole KV (``Engine.add_sequence``; the connector writes it before the forward pass);
3. **landed**: the target wrote the KV: the downtime is from the stop's read on the source to this
   write (``time.perf_counter`` in both processes: one machine, one clock).

A migration is **aborted** (the request keeps running on its source, nothing lost, the target's
blocks freed) when the target has no blocks for a stage (``target full``), or the request ended
(``finished``) or is not decoding (``preempted``) when the source is asked for a stage. A request
is on exactly one engine at every moment, or on none between its stop and its continuation's
arrival (the parent's books say the target from the stop on).
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from servelab.cluster.migration import MigrationSettings
from servelab.core.migration_policy import Migrate, MigrationPolicy, ReplicaLoad, checked_decisions
from servelab.core.request import Request, Sequence
from servelab.results.migration_figures import MigrationRecord, MigrationSums

if TYPE_CHECKING:
    from servelab.cluster.procs.cluster import ProcessCluster
    from servelab.cluster.procs.replica import ProcReplica


@dataclass
class ProcMigration:
    """One migration under way: its request, the two replicas, the tokens whose KV was read so far,
    the bytes, the pre-copy stages, whether the next read stops it, and its times (run seconds)."""

    request: Request
    source: "ProcReplica"
    target: "ProcReplica"
    start_s: float
    copied_tokens: int = 0
    nbytes: float = 0.0
    stages: int = 0
    stop_next: bool = False
    stop_s: float | None = None


class ProcMigrationDriver:
    """A wall-clock cluster's migrations: asks ``policy`` every ``settings.interval_s``, relays each
    migration's messages, keeps the sums (:class:`MigrationSums`) the summary writes."""

    def __init__(self, cluster: "ProcessCluster", policy: MigrationPolicy, settings: MigrationSettings) -> None:
        self.cluster = cluster
        self.policy = policy
        self.settings = settings
        self.sums = MigrationSums()
        self.active: dict[str, ProcMigration] = {}  # request id -> its migration
        self.next_tick_s = settings.interval_s
        self._draining: set[int] = set()

    @property
    def protocol(self):
        assert self.cluster.protocol is not None  # built once every replica is ready
        return self.cluster.protocol

    def _run_s(self, perf_counter_s: float) -> float:
        return perf_counter_s - self.cluster.t0

    # ---- the periodic question ------------------------------------------------------------------
    def tick(self, now: float) -> None:
        """Called by the parent's loop at ``now`` (run seconds): drain from ``cluster.drain_from_s``;
        ask the policy when an interval has passed and requests are outstanding."""
        if self.settings.draining and not self._draining and now >= self.settings.drain_from_s:
            self._draining.update(self.settings.draining)
            self.protocol.draining.update(self.settings.draining)
        if now < self.next_tick_s:
            return
        interval = self.settings.interval_s
        self.next_tick_s = (math.floor(now / interval) + 1) * interval
        if self.protocol.placements:
            for move in checked_decisions(self.policy, self.loads(), now):
                self._start(move, now)

    def loads(self) -> list[ReplicaLoad]:
        """What the policy sees of every replica now."""
        out = {r.index: 0 for r in self.cluster.replicas}
        into = dict(out)
        for m in self.active.values():
            out[m.source.index] += 1
            into[m.target.index] += 1
        return [self._load(r, out[r.index], into[r.index]) for r in self.cluster.replicas]

    def _load(self, r: "ProcReplica", out: int, into: int) -> ReplicaLoad:
        placements = self.protocol.placements
        load = r.load
        if load is None:  # nothing reported yet: an empty pool
            assert r.limits is not None  # it reported ready
            load = ReplicaLoad(r.index, r.role, r.num_kv_blocks, r.limits.block_size, 0, r.num_kv_blocks)

        def here(q) -> bool:  # a report is from the replica's last step: a request since moved is not there
            p = placements.get(q.id)
            return p is not None and p.replica == r.index

        def flagged(qs):
            return tuple(dataclasses.replace(q, migrating=q.id in self.active) for q in qs if here(q))

        return dataclasses.replace(load, running=flagged(load.running), waiting=flagged(load.waiting),
                                   draining=r.index in self._draining, migrating_out=out, migrating_in=into)

    # ---- one migration --------------------------------------------------------------------------
    def _start(self, move: Migrate, now: float) -> None:
        placement = self.protocol.placements[move.request_id]
        source, target = self.cluster.replicas[placement.replica], self.cluster.replicas[move.target]
        m = self.active[move.request_id] = ProcMigration(placement.request, source, target, now,
                                                         stop_next=not self.settings.precopy)
        source.inbox.put(("mig_read", move.request_id, 0, m.stop_next))

    def _current(self, request_id: str, r: "ProcReplica", side: str) -> ProcMigration | None:
        """The migration of ``request_id`` whose ``side`` (source or target) is ``r`` (None: an answer
        about one aborted meanwhile)."""
        m = self.active.get(request_id)
        return m if m is not None and getattr(m, side) is r else None

    def kv(self, r: "ProcReplica", request_id: str, start: int, payload, reason: str | None) -> None:
        """The source read a pre-copy stage (``payload``), or could not (``reason``)."""
        m = self._current(request_id, r, "source")
        if m is None or m.stop_s is not None or start != m.copied_tokens:
            return
        if payload is None:
            return self._abort(m, reason or "finished")
        m.stages += 1
        m.nbytes += payload.nbytes
        m.copied_tokens = start + payload.num_tokens
        assert r.limits is not None
        new_blocks = -(-payload.num_tokens // r.limits.block_size)
        m.stop_next = m.stages >= self.settings.max_stages or new_blocks <= self.settings.stop_blocks
        m.target.inbox.put(("mig_hold", m.request, start, payload, m.copied_tokens))

    def held(self, r: "ProcReplica", request_id: str, ok: bool) -> None:
        """The target holds a stage's KV and blocks for it (``ok``), or had no room (it freed them)."""
        m = self._current(request_id, r, "target")
        if m is None or m.stop_s is not None:
            return
        if not ok:
            del self.active[request_id]
            self.sums.aborted["target full"] += 1
            return
        m.source.inbox.put(("mig_read", request_id, m.copied_tokens, m.stop_next))

    def stopped(self, r: "ProcReplica", request_id: str, seq: Sequence, start: int, payload,
                stop_at: float) -> None:
        """The source stopped the request and read its last tokens: it goes on on the target."""
        m = self.active[request_id]
        assert m.source is r and start == m.copied_tokens, f"request {request_id!r}: an unexpected stop"
        m.nbytes += payload.nbytes
        m.copied_tokens = start + payload.num_tokens
        m.stop_s = self._run_s(stop_at)
        moved = self.protocol.migrate(seq, m.target)
        m.target.inbox.put(("mig_seq", moved, start, payload))

    def landed(self, r: "ProcReplica", request_id: str, at: float) -> None:
        """The target wrote the request's KV: the migration is done."""
        m = self.active.pop(request_id)
        assert m.target is r and m.stop_s is not None, f"request {request_id!r} landed unexpectedly"
        self.sums.done.append(MigrationRecord(request_id, m.source.index, r.index, m.copied_tokens, m.nbytes,
                                              m.stages, m.start_s, m.stop_s, self._run_s(at)))

    def ended(self, r: "ProcReplica", request_id: str) -> None:
        """``request_id`` ended on ``r``: a migration of it from there is aborted."""
        m = self._current(request_id, r, "source")
        if m is not None and m.stop_s is None:
            self._abort(m, "finished")

    def _abort(self, m: ProcMigration, reason: str) -> None:
        del self.active[m.request.id]
        self.sums.aborted[reason] += 1
        m.target.inbox.put(("mig_drop", m.request.id))
