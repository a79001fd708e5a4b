"""The cluster protocol, written once: where each request goes, and what the router knows.

Three drivers run it (docs/cluster.md, "One protocol, three drivers"): the simulator's virtual-clock
loop (:mod:`servelab.cluster.simulated`), the parent of a wall-clock cluster of engine processes
(:mod:`servelab.cluster.procs.cluster`) and the HTTP router ``servelab route``
(:mod:`servelab.serve.route`). A driver moves things (an engine call, a message to a process, an
HTTP request) and tells the protocol what happened; the protocol decides and keeps the books:

- **placement**: an arriving request is offered to the router plugin, one :class:`ReplicaView` per
  replica of the pool that serves its first stage (:meth:`ClusterProtocol.arrive`), and the
  plugin's answer is checked (:func:`checked_route`);
- **the prefill->decode hand-off**: a request whose prompt and first token a prefill replica
  computed moves to a decode replica the router picks, as its continued sequence
  (:meth:`ClusterProtocol.hand_off`): a move of the request to another replica at its first token
  (:meth:`ClusterProtocol.move`); a live migration (:meth:`ClusterProtocol.migrate`) is the same
  move at a later token, to the replica a migration policy chose;
- **the router's bookkeeping**: per replica, what the router placed there and saw end and the
  figures ``per_replica`` reports (:class:`RouterCounts`); per request, where it is and in which
  phase (:class:`Placement`);
- **what a router sees**: one builder of :class:`ReplicaView` (:meth:`ReplicaRecord.view`), from
  the router's own counts and the gauges the replica last reported (:class:`Gauges`).

The protocol never steps an engine, sends a message or waits: it is called in the driver's order,
so the simulator's runs stay a function of config and seed.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Callable, Collection, Generic, NamedTuple, Sequence as Seq, TypeVar

from servelab.core.interfaces import EngineLimits, ReplicaView, Router, RouterError
from servelab.core.request import Request, Sequence, Status

if TYPE_CHECKING:
    from servelab.engine.engine import Engine

ROLES = ("mixed", "prefill", "decode")
#: A request's phase on its replica: colocated; computing its prompt and first token on a prefill
#: replica; prefilled there and waiting to move; continuing on a decode replica (KV moved or on its way).
PHASES = ("mixed", "prefill", "prefilled", "decode")


# ---- the router's books -------------------------------------------------------------------------
@dataclass(kw_only=True)
class RouterCounts:
    """What a router process knows of a replica by itself: the requests (and their prompt + max_tokens)
    it placed there and saw end, and the figures ``per_replica`` reports."""

    placed: int = 0
    placed_tokens: int = 0
    ended: int = 0
    ended_tokens: int = 0
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0
    output_tokens: int = 0

    def place(self, request: Request) -> None:
        self.placed += 1
        self.placed_tokens += request.prompt_len + request.max_tokens

    def end(self, request: Request) -> None:
        self.ended += 1
        self.ended_tokens += request.prompt_len + request.max_tokens

    def count_end(self, request: Request, seq: Sequence, handed_on: bool = False, arrived_outputs: int = 0) -> None:
        """``request`` ended here (or left, migrating) as ``seq``: the router's count, and the figures.
        ``handed_on``: its prompt was computed (and counted) on another replica; ``arrived_outputs``:
        the output tokens ``seq`` carried when it came here (a hand-off's first token, a migration's)."""
        self.end(request)
        self.output_tokens += seq.num_output_tokens - arrived_outputs
        if not handed_on:
            self.prompt_tokens += request.prompt_len
            self.cached_prompt_tokens += seq.num_cached_prompt_tokens

    @property
    def num_outstanding(self) -> int:
        """Requests placed here and not yet seen end."""
        return self.placed - self.ended


class Gauges(NamedTuple):
    """What a replica's metrics say at a step boundary: its scheduler's waiting (waiting + swapped)
    and running requests, and the share of its KV blocks in use."""

    num_waiting: int = 0
    num_running: int = 0
    kv_utilization: float = 0.0

    @classmethod
    def of(cls, engine: "Engine") -> "Gauges":
        """``engine``'s gauges now."""
        queues = engine.scheduler.queue_lengths()
        allocator = engine.allocator
        return cls(queues.get("waiting", 0) + queues.get("swapped", 0), queues.get("running", 0),
                   allocator.num_used_blocks() / max(1, allocator.num_blocks))


@dataclass
class ReplicaRecord(RouterCounts):
    """One replica as the protocol keeps it, whatever drives it: its place in the cluster, the
    router's counts and the gauges it last reported. A driver's subclass says whether a request
    fits (:meth:`can_hold`), its context length (:meth:`context_length`) and its KV pool (:meth:`kv_pool`)."""

    index: int
    role: str = field(default="mixed", kw_only=True)
    tensor_parallel_size: int = field(default=1, kw_only=True)
    gauges: Gauges = field(default=Gauges(), kw_only=True)  # as the replica last reported them
    # (what the last view showed, that view): a view is made for every replica on every arrival,
    # and a replica's often shows the same as its last one did (nothing placed, ended or stepped since)
    _last_view: tuple[tuple, ReplicaView] | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"replica role {self.role!r} is not one of {ROLES}")

    def can_hold(self, request: Request, tokens: int | None = None) -> bool:
        """Whether ``tokens`` (default prompt + max_tokens) of ``request`` fit this replica at all."""
        raise NotImplementedError

    def context_length(self) -> int:
        """The most tokens a sequence may have here (its ``max_model_len``)."""
        raise NotImplementedError

    def kv_pool(self) -> tuple[int, int]:
        """``(num_kv_blocks, block_size)`` of its KV pool."""
        raise NotImplementedError

    def seen(self, at: float) -> tuple[int, int, Gauges]:
        """What a router knows at ``at`` of the ends here (count, prompt + max_tokens) and the gauges."""
        return self.ended, self.ended_tokens, self.gauges

    def view(self, can_hold: bool, at: float = 0.0) -> ReplicaView:
        """What a router sees of this replica at ``at`` (the one place a :class:`ReplicaView` is made).
        The view is immutable: when it would show what the last one showed, the last one is returned."""
        ended, ended_tokens, gauges = self.seen(at)
        shown = (can_hold, self.placed - ended, self.placed_tokens - ended_tokens, gauges, self.kv_pool(),
                 self.index, self.role, self.tensor_parallel_size)
        last = self._last_view
        if last is not None and shown == last[0]:
            return last[1]
        num_outstanding, outstanding_tokens, (num_kv_blocks, block_size) = shown[1], shown[2], shown[4]
        view = ReplicaView(index=self.index, role=self.role, can_hold=can_hold, num_outstanding=num_outstanding,
                           outstanding_tokens=outstanding_tokens, num_waiting=gauges.num_waiting,
                           num_running=gauges.num_running, kv_utilization=gauges.kv_utilization,
                           num_kv_blocks=num_kv_blocks,
                           block_size=block_size, tensor_parallel_size=self.tensor_parallel_size)
        self._last_view = (shown, view)
        return view


def request_fits(request: Request, limits: EngineLimits, can_ever_fit: Callable[[int], bool],
                 tokens: int | None = None) -> bool:
    """Whether ``tokens`` (default prompt + max_tokens) of ``request`` fit an engine of ``limits`` whose
    pool can ever hold ``n`` tokens when ``can_ever_fit(n)``."""
    prompt = request.prompt_len
    if prompt == 0 or request.max_tokens < 1 or prompt >= limits.max_model_len:
        return False
    return can_ever_fit(min(prompt + request.max_tokens if tokens is None else tokens, limits.max_model_len))


# ---- the router's choice ------------------------------------------------------------------------
def checked_route(router: Router, request: Request, views: list[ReplicaView], t: float) -> int | None:
    """The index ``router`` picks for ``request`` among ``views`` (None when none can hold it), checked:
    a router that raises, or picks a replica not offered or one that cannot hold the request, is a
    :class:`RouterError` naming the plugin and the request."""
    if not any(v.can_hold for v in views):
        return None
    name = type(router).name
    try:
        choice = router.route(request, views, t)
    except Exception as exc:  # reported naming the plugin and the request
        raise RouterError(f"router plugin {name!r} failed on request {request.id!r}: "
                          f"{type(exc).__name__}: {exc}") from exc
    offered = {v.index: v for v in views}
    view = offered.get(choice) if isinstance(choice, int) and not isinstance(choice, bool) else None
    if view is None:
        raise RouterError(f"router plugin {name!r} returned {choice!r} for request {request.id!r}: not one of "
                          f"the offered replicas {sorted(offered)}")
    if not view.can_hold:
        raise RouterError(f"router plugin {name!r} placed request {request.id!r} on replica {choice}, which cannot "
                          f"hold it ({request.prompt_len} prompt + {request.max_tokens} max tokens)")
    return choice


# ---- where each request is ----------------------------------------------------------------------
@dataclass
class Placement:
    """Where a request is: its replica and its phase (:data:`PHASES`), the request as it arrived,
    the replicas it was on before (a hand-off or a migration appends), and ``seq``: its
    sequence as the cluster last gave it to a replica (a moved request's continuation; the engine
    processes' parent keeps one per request), None while only a replica's engine holds it."""

    request: Request
    replica: int
    phase: str
    came_from: tuple[int, ...] = ()
    seq: Sequence | None = None
    arrived_outputs: int = 0  # the output tokens it carried when it came to its replica

    @property
    def handed_on(self) -> bool:
        """Its prompt was computed (and counted) on an earlier replica."""
        return bool(self.came_from)


def continues_after_prefill(pseq: Sequence, wants_more: bool, decode_max_model_len: int) -> bool:
    """Whether a request that ended on its prefill replica as ``pseq`` moves on to a decode replica:
    it finished at its length (its first token, no stop), asked for more (``wants_more``) and its
    tokens so far fit the decode pool's context. Else its record is the prefill's."""
    return (pseq.status is Status.FINISHED and pseq.finish_reason == "length" and wants_more
            and pseq.num_tokens < decode_max_model_len)


R = TypeVar("R", bound=ReplicaRecord)


class ClusterProtocol(Generic[R]):
    """Placement, the hand-off and the router's books for ``replicas`` (all mixed, or a prefill and
    a decode pool; a replica's ``index`` is its place in the list) behind ``router``. Each call is
    one thing that happened; nothing here waits."""

    def __init__(self, replicas: Seq[R], router: Router) -> None:
        self.replicas = list(replicas)
        self.router = router
        self.mixed = [r for r in self.replicas if r.role == "mixed"]
        self.prefill = [r for r in self.replicas if r.role == "prefill"]
        self.decode = [r for r in self.replicas if r.role == "decode"]
        if bool(self.prefill) != bool(self.decode) or (self.mixed and self.prefill):
            raise ValueError("a cluster is either all mixed replicas or prefill and decode pools")
        self.placements: dict[str, Placement] = {}  # request id -> where it is, until it ends for good
        self.draining: set[int] = set()  # replicas offered to the router as full (they are emptied: migration)
        self.decode_max_model_len = min((d.context_length() for d in self.decode), default=0)

    @property
    def disaggregated(self) -> bool:
        return bool(self.prefill)

    # ---- the router's choice ----------------------------------------------------------------------
    def route(self, request: Request, pool: Seq[R], at: float, tokens: int | None = None,
              exclude: Collection[int] = ()) -> R | None:
        """The router's choice among ``pool`` at ``at`` (checked), or None when no replica can hold
        ``tokens`` of the request; replicas in ``exclude`` (tried already) are offered as full."""
        views = [r.view(r.index not in exclude and r.can_hold(request, tokens), at) for r in pool]
        choice = checked_route(self.router, request, views, at)
        return None if choice is None else self.replicas[choice]

    def place(self, r: R, request: Request, phase: str | None = None) -> Placement:
        """``request`` goes to ``r`` (in ``phase``; default ``r``'s role): counted there, recorded."""
        r.place(request)
        placement = self.placements.get(request.id)
        if placement is None:
            placement = self.placements[request.id] = Placement(request, r.index, phase or r.role)
        else:
            placement.came_from += (placement.replica,)
            placement.replica, placement.phase = r.index, phase or r.role
        return placement

    def end(self, r: R, request: Request) -> None:
        """``request`` left ``r`` with nothing the cluster counts (an HTTP answer, a failure, a client
        that left): the router's count only."""
        r.end(request)
        self.placements.pop(request.id, None)

    def finished(self, request: Request, index: int) -> None:
        """Tell the router that ``request`` left replica ``index`` (a driver calls this in its own order)."""
        self.router.on_finish(request, index)

    # ---- one request's life -----------------------------------------------------------------------
    def arrive(self, request: Request, t: float) -> tuple[R, Request]:
        """An arriving request's first replica and what that replica is asked for: colocated, the
        request, where the router puts it; disaggregated, its prompt and first token
        (``max_tokens=1``) on a prefill replica, or the request itself on a decode replica when no
        decode replica can hold it (that replica rejects it, saying why). With no replica able to
        hold it the pool's first gets it, and rejects it."""
        if not self.disaggregated:
            r = self.route(request, self.mixed, t, exclude=self.draining) or self.mixed[0]
            self.place(r, request)
            return r, request
        if not any(d.can_hold(request) for d in self.decode):
            self.place(self.decode[0], request)
            return self.decode[0], request
        p = self.route(request, self.prefill, t, tokens=request.prompt_len + 1) or self.prefill[0]
        self.place(p, request)
        return p, replace(request, max_tokens=1)

    def continues(self, pseq: Sequence) -> bool:
        """Whether ``pseq``, ended on its prefill replica, moves on to a decode replica."""
        return continues_after_prefill(pseq, self.placements[pseq.id].request.max_tokens > 1,
                                       self.decode_max_model_len)

    def prefill_ended(self, p: R, pseq: Sequence, continues: bool) -> Sequence | None:
        """Prefill replica ``p`` is done with a request, ended there as ``pseq``: counted there and
        told to the router. ``continues``: it moves on (:meth:`hand_off`), and None is returned;
        else (rejected, or stopped at its first token) its final record, the whole request ended
        as ``pseq`` ended."""
        placement = self.placements[pseq.id]
        request = placement.request
        p.count_end(request, pseq)
        self.finished(request, p.index)
        if continues:
            placement.phase = "prefilled"
            return None
        del self.placements[pseq.id]
        return ended_at_prefill(pseq, request)

    def hand_off(self, pseq: Sequence, t: float) -> tuple[R, Sequence]:
        """The prefill->decode hand-off: the request prefilled as ``pseq`` moves at its first token
        to the decode replica the router picks at ``t``. The driver gives that replica the returned
        continuation, its prompt's KV through the replicas' KV connectors."""
        return self.move(pseq, self.decode, t)

    def move(self, seq: Sequence, pool: Seq[R], t: float, phase: str = "decode") -> tuple[R, Sequence]:
        """Move the request that ``seq`` carries so far to the replica of ``pool`` the router picks at
        ``t``: placed there, recorded (it came from its replica), and its continuation returned."""
        placement = self.placements[seq.id]
        target = self.route(placement.request, pool, t)
        if target is None:  # the arrival checked that one can: kept for custom pools
            raise RuntimeError(f"no {phase} replica can hold request {placement.request.id!r}")
        return target, self._moved(placement, seq, target, phase)

    def _moved(self, placement: Placement, seq: Sequence, target: R, phase: str) -> Sequence:
        """The request of ``placement``, carried so far by ``seq``, is now on ``target`` (in ``phase``):
        placed there, recorded, its continuation returned (what the hand-off and a migration share)."""
        moved = continued(seq, placement.request)
        self.place(target, placement.request, phase)
        placement.seq = moved
        placement.arrived_outputs = seq.num_output_tokens
        return moved

    def migrate(self, seq: Sequence, target: R) -> Sequence:
        """Live migration: the request running as ``seq`` on its replica (stopped there, its KV copied)
        continues on ``target``, which a migration policy chose: it leaves its replica as a hand-off
        leaves its prefill replica (counted there with the outputs made there, told to the router) and
        is moved (:meth:`move`'s bookkeeping, at a later token). Returns the continuation the driver
        gives ``target``, its KV through the replicas' KV connectors."""
        placement = self.placements[seq.id]
        source = self.replicas[placement.replica]
        source.count_end(placement.request, seq, handed_on=placement.handed_on,
                         arrived_outputs=placement.arrived_outputs)
        self.finished(placement.request, source.index)
        return self._moved(placement, seq, target, placement.phase)

    def prompt_received(self, d: R, request: Request, cached_tokens: int) -> None:
        """``request``'s prompt KV reached ``d`` (``cached_tokens`` of it were cached there already)."""
        d.prompt_tokens += request.prompt_len
        d.cached_prompt_tokens += cached_tokens

    def ended(self, r: R, seq: Sequence) -> Sequence:
        """``seq`` ended for good on ``r`` (a mixed or decode replica): counted there; its record. The
        driver tells the router (:meth:`finished`) in its own order."""
        placement = self.placements.pop(seq.id)
        r.count_end(seq.request, seq, handed_on=placement.handed_on, arrived_outputs=placement.arrived_outputs)
        return seq


def ended_at_prefill(pseq: Sequence, request: Request) -> Sequence:
    """The record of ``request`` that ended on its prefill replica as ``pseq`` (rejected, or stopped at
    its first token): the whole request, ended as ``pseq`` ended."""
    final = continued(pseq, request)
    assert pseq.finish_time is not None  # it ended
    if pseq.status is Status.REJECTED:
        assert pseq.rejected_reason is not None
        final.reject(pseq.rejected_reason, pseq.finish_time)
    else:
        assert pseq.finish_reason is not None
        final.finish(pseq.finish_reason, pseq.finish_time)
    return final


def continued(pseq: Sequence, request: Request) -> Sequence:
    """A sequence of the whole ``request`` carrying on from ``pseq``, its sequence so far on another
    replica (outputs, their times, when it was first scheduled, its cache hits and preemptions)."""
    seq = Sequence(request, arrival_s=pseq.arrival_s)
    for token, t in zip(pseq.output_token_ids, pseq.token_times):
        seq.append_token(token, t)
    seq.first_scheduled_time = pseq.first_scheduled_time
    seq.num_cached_prompt_tokens = pseq.num_cached_prompt_tokens
    seq.num_preemptions = pseq.num_preemptions
    return seq
