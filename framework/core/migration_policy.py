"""The ``migration_policy`` kind: which running requests move to another replica, and where.

A cluster (``cluster.replicas=N``) asks its migration policy every ``cluster.migration_interval_s``
seconds with one :class:`ReplicaLoad` per replica (its KV blocks used and free, its queue, its
running requests as :class:`RequestLoad` s, whether it is draining); the policy answers with
:class:`Migrate` decisions. The cluster checks each (:func:`checked_decisions`) and moves the
request live: its KV is pre-copied over the link stage by stage while it keeps decoding on its
replica, then the blocks written meanwhile are copied while it is stopped (the downtime), then it
continues on the target (:mod:`servelab.cluster.migration`). A move that cannot finish (the target
runs out of blocks, the request ends or is preempted first) is aborted: the request stays where it
was, nothing lost. A migration never changes what the model computes.

``none`` (the default) moves nothing, and a cluster with it runs exactly as one without the kind.
"""

from __future__ import annotations

from abc import abstractmethod
from dataclasses import dataclass
from typing import ClassVar, Sequence as Seq

from servelab.core.contexts import MigrationPolicyContext
from servelab.core.interfaces import Plugin


@dataclass(frozen=True)
class RequestLoad:
    """One request on a replica, as a migration policy sees it. ``num_blocks``: the KV blocks it
    holds there (a queued one: 0); ``needed_blocks``: the blocks it needs to run now (its tokens so
    far, plus one); ``priority``: the request's (lower = more urgent, as ``scheduler=priority``);
    ``migrating``: a migration of it is under way."""

    id: str
    replica: int
    prompt_len: int
    num_output_tokens: int
    max_tokens: int
    num_blocks: int
    needed_blocks: int
    priority: int = 0
    migrating: bool = False

    @property
    def num_tokens(self) -> int:
        return self.prompt_len + self.num_output_tokens


@dataclass(frozen=True)
class ReplicaLoad:
    """One replica now: its pool (``num_kv_blocks`` of ``block_size`` tokens; ``num_used_blocks``,
    ``num_free_blocks``, blocks reserved for migrations coming in included), its ``running``
    requests (decoding or prefilling, in its scheduler's order) and ``waiting`` ones (queued,
    preempted, swapped), the migrations under way from (``migrating_out``) and to (``migrating_in``)
    it, and ``draining``: it takes no new requests and its running ones should leave."""

    index: int
    role: str
    num_kv_blocks: int
    block_size: int
    num_used_blocks: int
    num_free_blocks: int
    running: tuple[RequestLoad, ...] = ()
    waiting: tuple[RequestLoad, ...] = ()
    draining: bool = False
    migrating_out: int = 0
    migrating_in: int = 0

    @property
    def num_running(self) -> int:
        return len(self.running)

    @property
    def num_waiting(self) -> int:
        return len(self.waiting)


@dataclass(frozen=True)
class Migrate:
    """Move request ``request_id`` (running on some replica) to replica ``target``."""

    request_id: str
    target: int


class MigrationPolicyError(RuntimeError):
    """A migration policy's answer names what may not move (names the plugin and the request)."""


class MigrationPolicy(Plugin):
    """Chooses live migrations between a cluster's replicas (``migration_policy=<name>``).

    :meth:`decide` is called every ``context.interval_s`` of the cluster's clock (the first time
    one interval after the start) with every replica's :class:`ReplicaLoad`, and returns the
    migrations to start now (empty: none). Each must name a request that is running on a replica
    and not migrating already, and a replica other than its own that is not draining; anything
    else (an unknown or queued request, a request named twice, an index out of range, a raise)
    stops the run with :class:`MigrationPolicyError` naming the plugin and the request. A policy
    sees loads, never how many tokens a request will generate. ``moves_requests = False``
    (``none``) means the cluster never asks: no pricing, no connector, today's run exactly.
    """

    context_type = MigrationPolicyContext
    context: MigrationPolicyContext
    moves_requests: ClassVar[bool] = True

    @abstractmethod
    def decide(self, replicas: Seq[ReplicaLoad], now: float) -> Seq[Migrate]:
        """The migrations to start at ``now`` among ``replicas`` (index order)."""


def checked_decisions(policy: MigrationPolicy, replicas: Seq[ReplicaLoad], now: float) -> list[Migrate]:
    """``policy``'s decisions at ``now``, each checked (see :class:`MigrationPolicy`)."""
    name = type(policy).name
    try:
        answer = list(policy.decide(replicas, now))
    except Exception as exc:  # reported naming the plugin
        raise MigrationPolicyError(f"migration_policy plugin {name!r} failed at t={now:g}: "
                                   f"{type(exc).__name__}: {exc}") from exc
    running = {q.id: r for r in replicas for q in r.running}
    migrating = {q.id for r in replicas for q in (*r.running, *r.waiting) if q.migrating}
    seen: set[str] = set()
    for move in answer:
        if not isinstance(move, Migrate):
            raise MigrationPolicyError(f"migration_policy plugin {name!r} returned {move!r}, not a Migrate")
        rid, target = move.request_id, move.target
        where = f"migration_policy plugin {name!r} moved request {rid!r} to replica {target!r} at t={now:g}"
        source = running.get(rid)
        if source is None:
            raise MigrationPolicyError(f"{where}: it is not running on any replica")
        if rid in seen or rid in migrating:
            raise MigrationPolicyError(f"{where}: it is migrating already")
        if not isinstance(target, int) or isinstance(target, bool) or not 0 <= target < len(replicas):
            raise MigrationPolicyError(f"{where}: not a replica index (0..{len(replicas) - 1})")
        if target == source.index:
            raise MigrationPolicyError(f"{where}: it runs there already")
        if replicas[target].draining:
            raise MigrationPolicyError(f"{where}: that replica is draining")
        seen.add(rid)
    return answer
