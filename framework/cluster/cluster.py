"""A cluster of engines behind a router, advanced as one discrete-event simulation.

Each replica is an unchanged engine with its own stack and its own clock. The loop always does
the earliest thing next: a KV transfer landing, a request arriving (the router places it), or
the step of the replica whose clock is earliest (ties: the lower index). So N replicas on one CPU
behave as N machines would on that time model, and a run is a function of its config and seed.

Colocated (``cluster.replicas=N``): every replica prefills and decodes. Disaggregated
(``cluster.prefill_replicas=P cluster.decode_replicas=D``): a request is placed on a prefill
replica, which computes its prompt and first token and keeps the KV; the router then picks a
decode replica, which allocates the blocks through its own allocator when it can (until then
the KV waits on the prefill replica: back-pressure) and pulls the KV over the link
(:mod:`servelab.cluster.transfer`); when it lands the prefill replica frees its copy and the
sequence joins the decode replica's scheduler as a decode. The first token reaches the client
with the KV, so TTFT includes the transfer.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from dataclasses import replace
from typing import Callable, Iterable

from servelab.cluster.replica import Replica
from servelab.cluster.transfer import KVLink, Transfer, schedule_transfer
from servelab.core.interfaces import Router, RouterError
from servelab.core.request import Request, Sequence, Status

INF = float("inf")


class Cluster:
    """Replicas, a router, and (disaggregated) the links between prefill and decode replicas.

    ``links[(p, d)]``: the link from prefill replica ``p`` to decode replica ``d``;
    ``kv_bytes_per_token``: one token's KV over all layers and ranks; ``num_layers``: how many
    layer-sized pieces an overlapped transfer streams in. ``request_listeners`` are told of each
    request's final sequence once (its record: the run's writer listens).
    """

    def __init__(self, replicas: list[Replica], router: Router, links: dict[tuple[int, int], KVLink] | None = None,
                 kv_bytes_per_token: float = 0.0, num_layers: int = 1, overlap_kv_transfer: bool = True) -> None:
        self.replicas = replicas
        self.router = router
        self.mixed = [r for r in replicas if r.role == "mixed"]
        self.prefill = [r for r in replicas if r.role == "prefill"]
        self.decode = [r for r in replicas if r.role == "decode"]
        if bool(self.prefill) != bool(self.decode) or (self.mixed and self.prefill):
            raise ValueError("a cluster is either all mixed replicas or prefill and decode pools")
        self.links = links or {}
        self.kv_bytes_per_token = kv_bytes_per_token
        self.num_layers = num_layers
        self.overlap = overlap_kv_transfer
        self.request_listeners: list[Callable[[Sequence], None]] = []
        self.num_ended = 0
        self.transfers: list[Transfer] = []
        self.keep_transfers = False  # tests read each transfer; a long run keeps only the sums
        self.kv_transfer_bytes = 0.0
        self.kv_transfer_s = 0.0
        self.kv_transfer_exposed_s = 0.0
        self.num_kv_transfers = 0
        self._events: list[tuple[float, int, Callable[[], None]]] = []
        self._order = itertools.count()
        self._origin: dict[str, Request] = {}  # request id -> the request as it arrived (while prefilling)
        self._pending_kv: dict[int, deque] = {d.index: deque() for d in self.decode}
        self._in_flight: dict[str, Sequence] = {}  # decode-side sequences whose KV is on the way
        self._link_free = {p.index: 0.0 for p in self.prefill}
        for r in replicas:
            r.engine.end_listeners.append(lambda seq, r=r: self._on_engine_end(r, seq))
        for p in self.prefill:
            p.engine.hold_kv_on_finish = True

    @property
    def disaggregated(self) -> bool:
        return bool(self.prefill)

    # ---- the loop -------------------------------------------------------------------------
    def run(self, requests: Iterable[Request], time_scale: float = 1.0,
            on_progress: Callable[[int], None] | None = None) -> None:
        """Feed ``requests`` at ``arrival_time * time_scale`` and run until every one has ended.
        Raises what a replica or the router raises; the replicas' state then holds the partial results."""
        if getattr(requests, "in_arrival_order", False):
            pending = iter(requests)
        else:
            pending = iter(sorted(requests, key=lambda r: r.arrival_time))
        for r in self.replicas:
            r.engine.reset_clock()
        upcoming = next(pending, None)
        reported = 0
        while True:
            t_arrival = upcoming.arrival_time * time_scale if upcoming is not None else INF
            t_event = self._events[0][0] if self._events else INF
            stepper, t_step = None, INF
            for r in self.replicas:
                if r.busy:
                    t = r.engine.now()
                    if t < t_step:
                        stepper, t_step = r, t
            if t_event <= t_arrival and t_event <= t_step:
                if t_event == INF:
                    break
                heapq.heappop(self._events)[2]()
            elif t_arrival <= t_step:
                self._arrive(upcoming, t_arrival)
                upcoming = next(pending, None)
            else:
                self._step(stepper)
            if on_progress and self.num_ended > reported:
                on_progress(self.num_ended - reported)
                reported = self.num_ended
        stuck = [r for r in self.replicas if r.engine.has_unfinished()]
        if stuck or any(self._pending_kv.values()):
            r = stuck[0] if stuck else self.decode[0]
            raise RuntimeError(f"replica {r.index} ({r.role}, scheduler {type(r.engine.scheduler).name!r}) made no "
                               f"progress with {r.engine.scheduler.num_unfinished()} requests unfinished (queues: "
                               f"{r.engine.scheduler.queue_lengths()}, KV transfers waiting for blocks: "
                               f"{len(self._pending_kv.get(r.index, ()))})")

    def _step(self, r: Replica) -> None:
        if r.role == "decode" and self._pending_kv[r.index]:
            self._pull(r, r.engine.now())
        r.mark_step_start()
        if r.engine.step() is None:
            r.stalled = True  # nothing could run: wait for an arrival, a landing or freed blocks

    def _at(self, t: float, action: Callable[[], None]) -> None:
        heapq.heappush(self._events, (t, next(self._order), action))

    # ---- placement ------------------------------------------------------------------------
    def _arrive(self, request: Request, t: float) -> None:
        if not self.disaggregated:
            self._admit(self._route(request, self.mixed, t) or self.mixed[0], request, t)
            return
        if not any(d.can_hold(request) for d in self.decode):  # the decode replica rejects it, saying why
            self._admit(self.decode[0], request, t)
            return
        prefill = self._route(request, self.prefill, t, tokens=request.prompt_len + 1) or self.prefill[0]
        self._origin[request.id] = request
        prefill.wake(t)
        prefill.place(request)
        prefill.engine.add_request(replace(request, max_tokens=1), t)  # the prompt and its first token

    def _admit(self, r: Replica, request: Request, t: float) -> None:
        r.wake(t)
        r.place(request)
        r.engine.add_request(request, t)

    def _route(self, request: Request, pool: list[Replica], t: float, tokens: int | None = None) -> Replica | None:
        """The router's choice among ``pool`` (checked), or None when no replica can hold the request."""
        views = [r.view(t, r.can_hold(request, tokens)) for r in pool]
        if not any(v.can_hold for v in views):
            return None
        name = type(self.router).name
        try:
            choice = self.router.route(request, views, t)
        except Exception as exc:  # noqa: BLE001 - reported naming the plugin and the request
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
        return self.replicas[choice]

    # ---- a request ends on a replica ------------------------------------------------------
    def _on_engine_end(self, r: Replica, seq: Sequence) -> None:
        if r.role == "prefill":
            self._prefilled(r, seq)
            return
        transferred = self._in_flight.pop(seq.id, None) is not None
        r.end(seq.request)
        r.output_tokens += seq.num_output_tokens - (1 if transferred else 0)
        if not transferred:
            r.prompt_tokens += seq.request.prompt_len
            r.cached_prompt_tokens += seq.num_cached_prompt_tokens
        self.router.on_finish(seq.request, r.index)
        self._request_ended(seq)

    def _request_ended(self, seq: Sequence) -> None:
        self.num_ended += 1
        for listener in self.request_listeners:
            listener(seq)

    def _prefilled(self, p: Replica, pseq: Sequence) -> None:
        """A prefill replica is done with a request: hand its KV on, or end it there."""
        request = self._origin.pop(pseq.id)
        p.end(request)
        p.prompt_tokens += request.prompt_len
        p.cached_prompt_tokens += pseq.num_cached_prompt_tokens
        p.output_tokens += pseq.num_output_tokens
        self.router.on_finish(request, p.index)
        done = (pseq.status is not Status.FINISHED or pseq.finish_reason != "length" or request.max_tokens <= 1
                or pseq.num_tokens >= min(d.engine.limits.max_model_len for d in self.decode))
        if done:  # rejected, or stopped at its first token: the record is the prefill's
            if pseq.status is Status.FINISHED:
                p.engine.release_kv(pseq.id)
            final = _continued(pseq, request)
            final.finish_reason, final.finish_time, final.rejected_reason = (pseq.finish_reason, pseq.finish_time,
                                                                            pseq.rejected_reason)
            final.move_to(pseq.status)
            self._request_ended(final)
            return
        self._at(pseq.finish_time, lambda: self._hand_off(p, pseq, request))

    # ---- disaggregation: the KV moves ---------------------------------------------------------
    def _hand_off(self, p: Replica, pseq: Sequence, request: Request) -> None:
        t = pseq.finish_time
        d = self._route(request, self.decode, t)
        if d is None:  # cannot happen after the arrival's check; kept for custom pools
            raise RuntimeError(f"no decode replica can hold request {request.id!r}")
        dseq = _continued(pseq, request)
        d.place(request)
        self._in_flight[dseq.id] = dseq
        self._pending_kv[d.index].append((p, pseq, dseq))
        self._pull(d, t)

    def _pull(self, d: Replica, t: float) -> None:
        """Allocate at ``t``, in arrival order, the blocks of the transfers waiting for ``d``; start
        each one that got its blocks. The first refusal stops (back-pressure: it retries at ``d``'s next
        step boundary, after that step's finished requests freed their blocks)."""
        queue, allocator = self._pending_kv[d.index], d.engine.allocator
        while queue:
            p, pseq, dseq = queue[0]
            hit = allocator.admit(dseq)  # a prompt prefix cached on the decode replica is not sent
            dseq.num_computed_tokens = hit
            if not allocator.allocate_slots(dseq, dseq.num_tokens - hit):
                allocator.free(dseq)
                dseq.num_computed_tokens = 0
                return
            queue.popleft()
            dseq.num_computed_tokens = dseq.prompt_len
            d.prompt_tokens += dseq.prompt_len
            d.cached_prompt_tokens += hit
            nbytes = (dseq.prompt_len - hit) * self.kv_bytes_per_token
            allocated = t  # the receiving side allocates beside the scheduler (a KV connector), at once
            start, done, duration = schedule_transfer(
                self.links[(p.index, d.index)], nbytes, self._link_free[p.index], pseq.first_scheduled_time,
                pseq.finish_time, allocated, self.num_layers, self.overlap)
            self._link_free[p.index] = done
            self.num_kv_transfers += 1
            self.kv_transfer_bytes += nbytes
            self.kv_transfer_s += duration
            self.kv_transfer_exposed_s += done - pseq.finish_time
            if self.keep_transfers:
                self.transfers.append(Transfer(dseq.id, p.index, d.index, nbytes, start, done, duration,
                                               done - pseq.finish_time))
            self._at(done, lambda p=p, d=d, pseq=pseq, dseq=dseq, done=done: self._land(p, d, pseq, dseq, done))

    def _land(self, p: Replica, d: Replica, pseq: Sequence, dseq: Sequence, t: float) -> None:
        p.engine.release_kv(pseq.id)
        if p.stalled:
            p.wake(t)  # its freed blocks may let it go on
        dseq.token_times[0] = t  # the first token reaches the client with its KV
        d.wake(t)
        d.engine.adopt(dseq)

    # ---- partial results ----------------------------------------------------------------------
    def live_sequences(self) -> list[Sequence]:
        """Every request not yet ended, once each (an interrupted run writes them as unfinished)."""
        live: list[Sequence] = []
        for r in self.replicas:
            for seq in r.engine.sequences.values():
                if seq.is_finished:
                    continue
                live.append(_continued(seq, self._origin[seq.id]) if r.role == "prefill" else seq)
        seen = {s.id for s in live}
        live.extend(s for s in self._in_flight.values() if s.id not in seen)
        return live


def _continued(pseq: Sequence, request: Request) -> Sequence:
    """A sequence of the whole ``request`` carrying on from its prefill-side sequence ``pseq``
    (outputs, their times, when it was first scheduled, its cache hits and preemptions)."""
    seq = Sequence(request, arrival_s=pseq.arrival_s)
    for token, t in zip(pseq.output_token_ids, pseq.token_times):
        seq.append_token(token, t)
    seq.first_scheduled_time = pseq.first_scheduled_time
    seq.num_cached_prompt_tokens = pseq.num_cached_prompt_tokens
    seq.num_preemptions = pseq.num_preemptions
    return seq
