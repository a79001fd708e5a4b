"""A cluster of engines behind a router, advanced as one discrete-event simulation.

Each replica is an unchanged engine with its own stack and its own clock. The loop always does
the earliest thing next: a KV transfer landing, a request arriving (the router places it), or
the step of the replica whose clock is earliest (ties: the lower index). So N replicas on one CPU
behave as N machines would on that time model, and a run is a function of its config and seed.

Where requests go, the hand-off and the router's books are the cluster protocol's
(:mod:`servelab.cluster.protocol`); this loop is its virtual-clock driver. Colocated
(``cluster.replicas=N``): every replica prefills and decodes. Disaggregated
(``cluster.prefill_replicas=P cluster.decode_replicas=D``): a request is placed on a prefill
replica, which computes its prompt and first token; its KV connector keeps the blocks. The router
then picks a decode replica and the cluster gives it the continued sequence; that replica's
scheduler learns from its connector that the prompt's KV is held elsewhere, allocates the blocks
through its own allocator when it can (until then the KV waits on the prefill replica:
back-pressure), and the transfer is priced over the link (:mod:`servelab.kv.pd.sim`,
:mod:`servelab.kv.link`); when it lands the prefill replica frees its copy and the
sequence decodes. Engines and schedulers see only the connector interface. The first token
reaches the client with the KV, so TTFT includes the transfer.
"""

from __future__ import annotations

import functools
import heapq
import itertools
from typing import Callable, Iterable

from servelab.cluster.autoscale import AutoscaleDriver
from servelab.cluster.migration import MigrationDriver
from servelab.cluster.protocol import ClusterProtocol
# their home before the protocol (old imports, tests, the conformance kit): re-exported
from servelab.cluster.protocol import checked_route as checked_route, continued as continued
from servelab.cluster.protocol import ended_at_prefill as ended_at_prefill
from servelab.cluster.replica import Replica
from servelab.core.interfaces import Router
from servelab.core.request import Request, Sequence
from servelab.engine.arrival_source import ArrivalSource, OpenLoop
from servelab.kv.link import KVLink
from servelab.kv.connectors import parts
from servelab.kv.pd.sim import PDTransfers
from servelab.results.cluster_summary import KVTransferSums

INF = float("inf")


class Cluster:
    """Replicas, a router, and (disaggregated) the links between prefill and decode replicas.

    ``links[(p, d)]``: the link from prefill replica ``p`` to decode replica ``d``;
    ``kv_bytes_per_token``: one token's KV over all layers and ranks; ``num_layers``: how many
    layer-sized pieces an overlapped transfer streams in. ``request_listeners`` are told of each
    request's final sequence once (its record: the run's writer listens). ``transfers``: the
    :class:`PDTransfers` whose connectors the replicas' engines were built with (disaggregated).
    ``protocol``: placement, the hand-off and the router's books, which this loop drives.
    """

    def __init__(self, replicas: list[Replica], router: Router, links: dict[tuple[int, int], KVLink] | None = None,
                 kv_bytes_per_token: float = 0.0, num_layers: int = 1, overlap_kv_transfer: bool = True,
                 transfers: PDTransfers | None = None) -> None:
        self.protocol: ClusterProtocol[Replica] = ClusterProtocol(replicas, router)
        self.replicas = replicas
        self.mixed, self.prefill, self.decode = self.protocol.mixed, self.protocol.prefill, self.protocol.decode
        if self.prefill and (transfers is None or any(
                not any(p is transfers.endpoints.get(r.index) for p in parts(r.engine.connector))
                for r in self.prefill + self.decode)):
            raise ValueError("a disaggregated cluster's engines are built with the connectors of its PDTransfers "
                             "(servelab.cluster.build does this)")
        self.kv = transfers if transfers is not None else PDTransfers()
        self.kv.links = links or {}
        self.kv.kv_bytes_per_token = kv_bytes_per_token
        self.kv.num_layers = num_layers
        self.kv.overlap = overlap_kv_transfer
        self.kv.should_send = self.protocol.continues
        self.kv.at = self._at
        self.kv.on_started = self._transfer_started
        self.kv.on_landed = self._landed
        self.request_listeners: list[Callable[[Sequence], None]] = []
        self.migration: MigrationDriver | None = None  # live migration (servelab.cluster.migration), if a policy moves
        self.autoscale: AutoscaleDriver | None = None  # scaling (servelab.cluster.autoscale), if an autoscaler scales
        self.num_ended = 0
        self._spans = True  # sim.fast_forward's spans (off under closed-loop arrivals: run)
        self._events: list[tuple[float, int, Callable[[], None]]] = []
        # What the loop is doing, as (time, 0 event | 1 arrival | 2 step, replica): the order it does
        # things in. A request's end is told to the router and the listeners in this order, also when a
        # replica fast-forwarded (sim.fast_forward) past other replicas' steps: held here until then.
        self._doing: tuple[float, int, int] = (0.0, 0, 0)
        self._told: list[tuple[tuple[float, int, int], int, Callable[[], None]]] = []
        self._order = itertools.count()
        for r in replicas:
            r.engine.end_listeners.append(functools.partial(self._on_engine_end, r))
        self._marks = [self._step_start_mark(r) for r in replicas]  # by replica index

    @property
    def router(self) -> Router:
        return self.protocol.router

    def kv_transfer_sums(self) -> KVTransferSums:
        """The prefill->decode transfers' sums (summary.json); each transfer is in ``kv.transfers``
        when ``kv.keep_transfers`` was set before the run."""
        kv = self.kv
        return KVTransferSums(kv.num_kv_transfers, kv.kv_transfer_bytes, kv.kv_transfer_s, kv.kv_transfer_exposed_s)

    @property
    def links(self) -> dict[tuple[int, int], KVLink]:
        return self.kv.links

    @property
    def disaggregated(self) -> bool:
        return bool(self.prefill)

    # ---- the loop -------------------------------------------------------------------------
    def run(self, requests: Iterable[Request] | ArrivalSource, time_scale: float = 1.0,
            on_progress: Callable[[int], None] | None = None) -> None:
        """Feed ``requests`` at ``arrival_time * time_scale`` (or as an arrival source says: closed-loop
        clients, :mod:`servelab.workloads.arrivals`) and run until every one has ended. Raises what a
        replica or the router raises; the replicas' state then holds the partial results.

        A source whose sends depend on ends (``stops_spans_at_ends``) runs without fast-forward: a
        replica's span could pass the end of a request on another replica whose client's next
        request it would then have to take in its past."""
        source = requests if isinstance(requests, ArrivalSource) else OpenLoop(requests, time_scale)
        hears_ends = source.stops_spans_at_ends
        self._spans = not hears_ends
        self.request_listeners.append(source.on_end)
        for r in self.replicas:
            r.engine.reset_clock()
        reported = 0
        # when each replica's next step starts (INF: idle or stalled), kept up to date by _steps_after
        next_step = [self._next_step_of(r) for r in self.replicas]
        try:
            while True:
                t_event = self._events[0][0] if self._events else INF
                t_step = min(next_step)
                stepper = self.replicas[next_step.index(t_step)] if t_step < INF else None  # ties: the lower index
                if hears_ends:  # the clients hear of every end so far before their next send is asked for
                    self._now_doing(min((t_event, 0, 0), (t_step, 2, stepper.index if stepper else 0)))
                t_arrival = source.next_time()
                if t_event <= t_arrival and t_event <= t_step:
                    if t_event == INF:
                        break
                    self._now_doing((t_event, 0, 0))
                    heapq.heappop(self._events)[2]()
                    moved = None
                elif t_arrival <= t_step:
                    due = source.pop_due(t_arrival)
                    assert due is not None  # t_arrival is finite
                    self._now_doing((due[1], 1, 0))
                    moved = self._arrive(*due)
                else:
                    assert stepper is not None  # t_step is finite
                    self._now_doing((t_step, 2, stepper.index))
                    self._step(stepper, min(t_arrival, t_event))
                    moved = stepper if stepper.role == "mixed" else None
                self._steps_after(next_step, moved)
                if on_progress and self.num_ended > reported:
                    on_progress(self.num_ended - reported)
                    reported = self.num_ended
        finally:  # ends held for the loop's order are told, also when a replica or the router raised
            for r in self.replicas:
                r.engine.settle_span()  # a paused span's sequences (a run that raised) are written as they are
            self._now_doing((INF, 0, 0))
            self.request_listeners.remove(source.on_end)
        if not source.exhausted and not any(r.engine.has_unfinished() for r in self.replicas):
            raise RuntimeError("arrivals stopped with requests left to send and none in flight")
        stuck = [r for r in self.replicas if r.engine.has_unfinished()]
        if stuck:
            r = stuck[0]
            raise RuntimeError(f"replica {r.index} ({r.role}, scheduler {type(r.engine.scheduler).name!r}) made no "
                               f"progress with {r.engine.scheduler.num_unfinished()} requests unfinished (queues: "
                               f"{r.engine.scheduler.queue_lengths()}, KV transfers waiting for blocks: "
                               f"{self.kv.waiting_for(r.index)})")

    @staticmethod
    def _next_step_of(r: Replica) -> float:
        return r.engine.now() if r.busy else INF

    def _steps_after(self, next_step: list[float], moved: Replica | None) -> None:
        """Bring ``next_step`` up to date after the loop did one thing: a colocated replica's own step
        or an arrival (``moved``: the replica it reached) changes only that replica; an event (a
        landing, a hand-off: any timed action) or a prefill/decode replica's step (its ends start
        transfers) may change any."""
        if moved is not None:
            next_step[moved.index] = self._next_step_of(moved)
        else:
            next_step[:] = [self._next_step_of(r) for r in self.replicas]

    def _step(self, r: Replica, until: float = INF) -> None:
        """One step of ``r``, then (``sim.fast_forward``) the quiet steps of ``r`` that start
        before ``until``, the cluster's next arrival or event: nothing else reaches ``r`` before.
        When nothing reached ``r`` since its last span stopped, the span goes on instead."""
        mark = self._marks[r.index]
        # resumable: a span paused at an arrival that went elsewhere goes on at no cost per sequence
        if self._spans and r.engine.fast_forward(until, mark, resumable=True):
            return
        mark()
        if r.engine.step() is None:
            r.stalled = True  # nothing could run: wait for an arrival, a landing or freed blocks
        elif self._spans:
            r.engine.fast_forward(until, mark, resumable=True)

    def _step_start_mark(self, r: Replica) -> Callable[[], None]:
        """What ``r``'s engine calls before each of its steps (made once: it runs before every
        fast-forwarded step): the loop is doing that step, and ``r`` keeps what a router reads meanwhile."""
        kv, now, index, mark = self.kv, r.engine.now, r.index, r.mark_step_start

        def mark_step_start() -> None:
            kv.now = t = now()  # a transfer the step's scheduler starts is allocated now
            self._doing = (t, 2, index)
            mark()
        return mark_step_start

    def _now_doing(self, doing: tuple[float, int, int]) -> None:
        """The loop turns to ``doing``: first tell what ended in everything done before it."""
        told = self._told
        while told and told[0][0] < doing:
            heapq.heappop(told)[2]()
        self._doing = doing

    def _tell(self, action: Callable[[], None]) -> None:
        """Tell of an end in the loop's order (:meth:`_now_doing`)."""
        heapq.heappush(self._told, (self._doing, next(self._order), action))

    def _at(self, t: float, action: Callable[[], None]) -> None:
        heapq.heappush(self._events, (t, next(self._order), action))

    # ---- placement: the protocol decides, the loop wakes the replica and hands the request over --
    def _arrive(self, request: Request, t: float) -> Replica:
        """``request`` arrives at ``t``: placed, its replica (returned) woken and given it. Nothing
        else changes: the migration and autoscaling drivers only set their next question's time."""
        if self.migration is not None:
            self.migration.arrived(t)
        if self.autoscale is not None:
            self.autoscale.arrived(t)
        r, asked = self.protocol.arrive(request, t)
        r.wake(t)
        r.engine.add_request(asked, t)
        return r

    # ---- a request ends on a replica ------------------------------------------------------
    def _on_engine_end(self, r: Replica, seq: Sequence) -> None:
        if self.migration is not None and self.migration.stopped(r, seq):
            return  # stopped for a migration's last copy: it goes on on another replica
        if r.role == "prefill":
            self._prefilled(r, seq)
            return
        final = self.protocol.ended(r, seq)
        self._tell(functools.partial(self._told_end, r.index, final))

    def _told_end(self, index: int, seq: Sequence) -> None:
        self.protocol.finished(seq.request, index)
        self._request_ended(seq)

    def _request_ended(self, seq: Sequence) -> None:
        self.num_ended += 1
        for listener in self.request_listeners:
            listener(seq)

    def _prefilled(self, p: Replica, pseq: Sequence) -> None:
        """A prefill replica is done with a request: hand its KV on, or end it there."""
        continues = self.protocol.continues(pseq)  # (what the prefill's connector was told when it ended)
        assert pseq.finish_time is not None  # it ended
        final = self.protocol.prefill_ended(p, pseq, continues)
        if final is not None:  # rejected, or stopped at its first token: the record is the prefill's
            self._request_ended(final)
            return
        self._at(pseq.finish_time, lambda: self._hand_off(p, pseq))

    # ---- disaggregation: the KV moves ---------------------------------------------------------
    def _hand_off(self, p: Replica, pseq: Sequence) -> None:
        t = pseq.finish_time
        assert t is not None  # the prefill ended
        d, dseq = self.protocol.hand_off(pseq, t)
        self.kv.expect(p.index, d.index, pseq, dseq.id)
        self.kv.now = t  # the decode replica allocates beside its scheduler (its connector), at once if it can
        d.engine.add_sequence(dseq)

    def _transfer_started(self, p: int, d: int, dseq: Sequence, hit: int) -> None:
        # a prompt prefix cached on the decode replica is not sent
        self.protocol.prompt_received(self.replicas[d], dseq.request, hit)

    def _landed(self, p_index: int, d_index: int, pseq: Sequence, dseq: Sequence, t: float) -> None:
        p, d = self.replicas[p_index], self.replicas[d_index]
        p.engine.poll_connector()  # the prefill replica frees its copy now
        if p.stalled:
            p.wake(t)  # its freed blocks may let it go on
        dseq.token_times[0] = t  # the first token reaches the client with its KV
        d.wake(t)
        d.engine.poll_connector()  # the decode scheduler seats it at its next step

    # ---- partial results ----------------------------------------------------------------------
    def live_sequences(self) -> list[Sequence]:
        """Every request not yet ended, once each (an interrupted run writes them as unfinished)."""
        placements = self.protocol.placements
        live: list[Sequence] = []
        for r in self.replicas:
            for seq in r.engine.sequences.values():
                if seq.is_finished:
                    continue
                live.append(continued(seq, placements[seq.id].request) if r.role == "prefill" else seq)
        seen = {s.id for s in live}
        live.extend(p.seq for p in placements.values()
                    if p.seq is not None and p.seq.id not in seen and not p.seq.is_finished)
        if self.migration is not None:  # stopped on their source, their last copy not landed
            live.extend(continued(s, placements[s.id].request) for s in self.migration.in_flight())
        return live
