"""Live migration on the simulator's cluster: the periodic question to the migration policy, and each
migration's stages, driven on the cluster loop's virtual clock.

Every ``cluster.migration_interval_s`` (while anything is left to do) the policy
(:mod:`servelab.core.migration_policy`) sees one :class:`ReplicaLoad` per replica and answers; each
checked decision starts a :class:`LiveMigration` of a decoding request from its replica (the
source) to the target:

1. **pre-copy**, while the request keeps decoding on the source: stage 0 copies the KV it has
   written so far, each later stage the KV written during the stage before. The target reserves
   blocks for what it received (in its own allocator, under a shadow id), so its pool and the
   policy's views count them. Each copy is priced over the link (:mod:`servelab.kv.migrate_sim`).
2. **stop-and-copy**, once a stage has at most ``cluster.migration_stop_blocks`` new blocks (or
   after ``migration_max_stages``; at once with ``migration_precopy=false``): the request stops on
   the source (``Engine.abort``; its connector keeps the blocks) and the rest is copied. The
   downtime is this copy.
3. **continue**: the last copy landed; the protocol moves the request (:meth:`ClusterProtocol.migrate`,
   the hand-off's move at a later token), the target gets the continued sequence through its
   connector, and once its scheduler allocated the blocks the source's copy is freed.

A migration is **aborted** (the request keeps running on the source, nothing lost, the target's
reservation freed) when the target has no blocks for a stage, or the request ended, was preempted or
left the running set before its stop. A request is on exactly one replica at every moment: the
source until its last copy lands, the target after.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Collection

from servelab.cluster.replica import Replica
from servelab.core.migration_policy import (Migrate, MigrationPolicy, ReplicaLoad, RequestLoad,
                                            checked_decisions)
from servelab.core.request import Sequence, Status
from servelab.kv.migrate_sim import MigrationLinks
from servelab.results.migration_figures import MigrationRecord, MigrationSums

if TYPE_CHECKING:
    from servelab.cluster.simulated import Cluster

SHADOW = "#migrating"  # a target's reservation holds its blocks under the request's id + this


@dataclass(frozen=True)
class MigrationSettings:
    """The ``cluster.migration_*`` keys: how often the policy is asked, and how a migration copies."""

    interval_s: float = 1.0
    precopy: bool = True
    stop_blocks: int = 1
    max_stages: int = 8
    draining: tuple[int, ...] = ()
    drain_from_s: float = 0.0


@dataclass
class LiveMigration:
    """One migration under way: the request's sequence on the source, the target's reservation
    (``shadow``), the tokens whose KV reached the target (or is on its way), the bytes so far."""

    seq: Sequence
    source: Replica
    target: Replica
    start_s: float
    shadow: Sequence
    copied_tokens: int = 0
    nbytes: float = 0.0
    stages: int = 0
    stop_s: float | None = None


class MigrationDriver:
    """The cluster's migrations: asks ``policy`` on the loop's clock, runs each migration's stages,
    keeps the sums (:class:`MigrationSums`)."""

    def __init__(self, cluster: "Cluster", policy: MigrationPolicy, links: MigrationLinks,
                 settings: MigrationSettings) -> None:
        self.cluster = cluster
        self.policy = policy
        self.links = links
        self.settings = settings
        self.sums = MigrationSums()
        self.active: dict[str, LiveMigration] = {}  # request id -> its migration
        self._ticking = False
        self._draining: set[int] = set()
        links.on_taken = self._taken
        if settings.draining:
            cluster._at(settings.drain_from_s, self._start_draining)

    @property
    def protocol(self):
        return self.cluster.protocol

    def _at(self, t: float, action: Callable[[], None]) -> None:
        self.cluster._at(t, action)

    # ---- the periodic question ------------------------------------------------------------------
    def arrived(self, t: float) -> None:
        """Something reached a replica at ``t`` (an arrival, a migrated request, freed blocks): if the
        policy went quiet, it is asked again at the next multiple of the interval after ``t``."""
        if not self._ticking:
            self._ticking = True
            interval = self.settings.interval_s
            self._tick_at((math.floor(t / interval) + 1) * interval)

    def _tick_at(self, t: float) -> None:
        self._at(t, lambda: self._tick(t))

    def _tick(self, now: float) -> None:
        for move in checked_decisions(self.policy, self.loads(), now):
            self._start(move, now)
        if self.active or any(r.busy for r in self.cluster.replicas):
            self._tick_at(now + self.settings.interval_s)
        else:  # nothing runs: quiet until something reaches a replica (else the loop would never end)
            self._ticking = False

    def _start_draining(self) -> None:
        self._draining.update(self.settings.draining)
        self.protocol.draining.update(self.settings.draining)

    def loads(self) -> list[ReplicaLoad]:
        """What the policy sees of every replica now."""
        migrating_out = {i: 0 for i in range(len(self.cluster.replicas))}
        migrating_in = dict(migrating_out)
        for m in self.active.values():
            migrating_out[m.source.index] += 1
            migrating_in[m.target.index] += 1
        return [self._load(r, migrating_out[r.index], migrating_in[r.index]) for r in self.cluster.replicas]

    def _load(self, r: Replica, out: int, into: int) -> ReplicaLoad:
        return replica_load(r, self.active, r.index in self._draining, out, into)

    def set_draining(self, index: int, draining: bool) -> None:
        """Replica ``index`` starts (or stops) draining: the router offers it as full, the policy sees it
        draining and may not move requests there (an autoscaler's scale-down, or a replica not in service)."""
        for books in (self._draining, self.protocol.draining):
            if draining:
                books.add(index)
            else:
                books.discard(index)

    def involves(self, index: int) -> bool:
        """Whether a migration under way comes from or goes to replica ``index``."""
        return any(index in (m.source.index, m.target.index) for m in self.active.values())

    # ---- one migration ---------------------------------------------------------------------------
    def _start(self, move: Migrate, now: float) -> None:
        source = self.cluster.replicas[self.protocol.placements[move.request_id].replica]
        target = self.cluster.replicas[move.target]
        seq = source.engine.sequences[move.request_id]
        shadow = Sequence(dataclasses.replace(seq.request, id=seq.id + SHADOW), arrival_s=seq.arrival_s)
        allocator = target.engine.allocator
        hit = allocator.start_sequence(shadow)  # a prefix cached on the target is not copied
        m = self.active[seq.id] = LiveMigration(seq, source, target, now, shadow, copied_tokens=hit)
        self._stage(m, now)

    def _stage(self, m: LiveMigration, now: float) -> None:
        """A stage begins at ``now``: abort, copy what was written since the last one, or stop and copy."""
        seq, source = m.seq, m.source
        if seq.is_finished or source.engine.sequences.get(seq.id) is not seq:
            return self._abort(m, "finished")
        if not decoding(seq) or seq.num_computed_tokens < m.copied_tokens:
            return self._abort(m, "preempted")
        new = seq.num_computed_tokens - m.copied_tokens
        block_size = source.engine.limits.block_size
        settings = self.settings
        last = (not settings.precopy or m.stages >= settings.max_stages
                or -(-new // block_size) <= settings.stop_blocks)
        allocator = m.target.engine.allocator
        reserve = seq.num_tokens if last else seq.num_computed_tokens  # the continuation holds all its tokens
        if not allocator.allocate_slots(m.shadow, reserve - m.shadow.num_computed_tokens):
            return self._abort(m, "target full")
        if last:
            return self._stop(m, now)
        m.stages += 1
        nbytes, done = self.links.copy(source.index, m.target.index, new, now)
        m.copied_tokens, m.nbytes = seq.num_computed_tokens, m.nbytes + nbytes
        self._at(done, lambda: self._stage(m, done))

    def _stop(self, m: LiveMigration, now: float) -> None:
        """Stop-and-copy: the request stops on the source; the rest of its KV goes over the link."""
        seq, source = m.seq, m.source
        stop = m.stop_s = max(now, source.engine.now())
        self.links.endpoints[source.index].stop(seq.id)
        source.engine.abort(seq.id)  # the cluster ignores this end (:meth:`stopped`); the blocks stay
        nbytes, done = self.links.copy(source.index, m.target.index, seq.num_computed_tokens - m.copied_tokens,
                                       stop)
        m.copied_tokens, m.nbytes = seq.num_computed_tokens, m.nbytes + nbytes
        self._at(done, lambda: self._land(m, done))

    def _land(self, m: LiveMigration, t: float) -> None:
        """The last copy landed: the request continues on the target."""
        target = m.target
        target.engine.allocator.free(m.shadow)  # the continuation takes the blocks in its own name
        moved = self.protocol.migrate(m.seq, target)
        assert m.stop_s is not None  # it stopped
        self.sums.done.append(MigrationRecord(m.seq.id, m.source.index, target.index, m.copied_tokens, m.nbytes,
                                              m.stages, m.start_s, m.stop_s, t))
        self.links.endpoints[target.index].expect(moved)
        target.wake(t)
        target.engine.add_sequence(moved)  # its scheduler allocates the blocks (at once, or when it can)
        target.engine.poll_connector()
        self.arrived(t)

    def _taken(self, target_index: int, moved: Sequence) -> None:
        """The target allocated a migrated sequence's blocks: the source's copy goes."""
        m = self.active.pop(moved.id)
        source = m.source
        self.links.endpoints[source.index].release(moved.id)
        source.engine.poll_connector()
        source.engine.forget(moved.id)  # it may come back later
        if source.stalled:
            source.wake(self.cluster.replicas[target_index].engine.now())

    def _abort(self, m: LiveMigration, reason: str) -> None:
        m.target.engine.allocator.free(m.shadow)
        del self.active[m.seq.id]
        self.sums.aborted[reason] += 1
        if m.target.stalled:
            m.target.wake(m.target.engine.now())  # its freed blocks may let it go on
            self.arrived(m.target.engine.now())

    # ---- what the cluster asks ------------------------------------------------------------------
    def in_flight(self) -> list[Sequence]:
        """Requests stopped on their source whose last copy has not landed (on no engine now)."""
        return [m.seq for m in self.active.values() if m.stop_s is not None and self.protocol.placements.get(
            m.seq.id) is not None and self.protocol.placements[m.seq.id].replica == m.source.index]

    def stopped(self, r: Replica, seq: Sequence) -> bool:
        """Whether ``seq``'s end on ``r`` is its stop for a migration's last copy (not an end)."""
        m = self.active.get(seq.id)
        return m is not None and m.source is r and m.stop_s is not None and m.seq is seq


def replica_load(r: Replica, migrating: Collection[str] = (), draining: bool = False, out: int = 0,
                 into: int = 0) -> ReplicaLoad:
    """What a cluster policy (a migration policy, an autoscaler) sees of ``r`` now; ``migrating``: the ids
    of requests a migration is moving."""
    return engine_load(r.engine, r.index, r.role, migrating, draining, out, into)


def engine_load(engine, index: int, role: str = "mixed", migrating: Collection[str] = (), draining: bool = False,
                out: int = 0, into: int = 0) -> ReplicaLoad:
    """:func:`replica_load` of the engine of replica ``index`` (an engine process builds its own report with it)."""
    allocator = engine.allocator
    block_size = engine.limits.block_size
    running, waiting = [], []
    for seq in engine.sequences.values():
        if seq.is_finished:
            continue
        view = RequestLoad(seq.id, index, seq.prompt_len, seq.num_output_tokens, seq.request.max_tokens,
                           len(allocator.block_table(seq.id)), -(-(seq.num_tokens + 1) // block_size),
                           seq.request.priority, seq.id in migrating)
        if decoding(seq):
            running.append(view)
        elif seq.status is not Status.RUNNING:
            waiting.append(view)
    return ReplicaLoad(index, role, allocator.num_blocks, block_size, allocator.num_used_blocks(),
                       allocator.num_free_blocks(), tuple(running), tuple(waiting), draining, out, into)


def decoding(seq: Sequence) -> bool:
    """Running, with its prompt computed: a request a migration can move."""
    return seq.status is Status.RUNNING and seq.num_output_tokens > 0 and seq.num_computed_tokens >= seq.prompt_len
