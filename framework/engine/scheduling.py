"""The unified token-budget scheduling loop that most schedulers share.

One step (vLLM v1's idea): every scheduled sequence gets a number of tokens to compute now — a
prompt chunk, or one decode token. Running sequences go first (in :meth:`running_order`), then
waiting ones are admitted (in the waiting queue's order) while the token budget, ``max_num_seqs``
and the allocator allow. When blocks run out, the preemption policy picks a victim among the
running sequences not yet scheduled this step. A policy is a subclass overriding a few small
methods: :meth:`waiting_key` (or :meth:`make_waiting_queue`), :meth:`running_order`,
:meth:`may_admit`, :meth:`may_preempt_for`, :meth:`prefill_token_cap`, and the notification
:meth:`on_admit` (a sequence starts running: charge it, start its quantum). An order that depends on
the time (aging, deadlines, starvation bounds) sets :attr:`QueueScheduler.time_dependent_key`:
its key then also gets ``now`` and the queue is re-sorted once per step.

KV a connector brings in (:mod:`servelab.core.kv_connector`: a host or disk tier, a prefill
replica's prompt): the connector is asked about a waiting sequence when :meth:`_admit` considers it,
in the waiting queue's (the policy's) order, as vLLM v1's ``Scheduler.schedule`` does; a
synchronous source's tokens are loaded into blocks claimed at that admission, with the first chunk
computed after them in the same step. A sequence preempted by recompute is asked again, so it
reloads what a tier still holds. An *asynchronous* load (a P/D hand-off: the sender holds its copy
until the receiver claims blocks) is announced by the connector when the sequence arrives: it
claims blocks for all its tokens in arrival order as soon as the pool takes them (back-pressure on
the sender), loads in its own state (``kv_waiting``, then ``kv_loading``: vLLM's
``WAITING_FOR_REMOTE_KVS``) taking no seat and no budget, and once it landed (:meth:`on_kv_loaded`)
runs first, in landing order, as seats and budget allow: it holds blocks for all its tokens, so
waiting behind the policy's queue would keep that KV idle and could deadlock the pool. Admission never touches the pool to find out
whether a request fits: :meth:`BlockAllocator.can_allocate` answers without side effects.

With chunked prefill off, ``EngineLimits.non_chunked_schedule`` picks the order of the phases:
``prefill_first`` (default; vLLM v0 before chunked prefill, SGLang without a mixed chunk) admits
waiting prompts first, whole, in a prompt-only step when any fits — no decode runs in that step,
and nobody is preempted for a prompt unless :meth:`may_preempt_for` allows it — and otherwise runs
the running sequences and swap-ins without admitting anyone; ``decode_first`` runs the running
sequences first and admits whole prompts into the budget left, as with chunked prefill.

A chunk is a *decode* when it is the one last token of a sequence whose prompt is computed
(speculative decoding: plus the sequence's drafts, a *verify*, bounded by :meth:`draft_token_cap`);
everything else (prompt chunks, recomputation after preemption) is *prefill* and counts against
:meth:`prefill_token_cap` as well as the step's token budget.
"""

from __future__ import annotations

import functools
import heapq
import itertools
import operator
from collections import deque
from typing import TYPE_CHECKING, Any, Callable, Iterable

from servelab.core.interfaces import PreemptionDecision, SchedulePlan, ScheduledSeq, Scheduler
from servelab.core.request import Sequence, Status


class WaitQueue:
    """Waiting sequences: FIFO when ``key`` is None, else a heap ordered by ``key(seq)``.

    ``push_front`` puts a sequence back at the head (FIFO), or lets its key decide and puts it
    first among equal keys.
    """

    def __init__(self, key: Callable[[Sequence], Any] | None = None) -> None:
        self._key = key
        self._fifo: deque[Sequence] = deque()
        self._heap: list[tuple[Any, int, Sequence]] = []
        self._counter = itertools.count()
        self._front_counter = itertools.count(1)

    def push(self, seq: Sequence) -> None:
        if self._key is None:
            self._fifo.append(seq)
        else:
            heapq.heappush(self._heap, (self._key(seq), next(self._counter), seq))

    def push_front(self, seq: Sequence) -> None:
        if self._key is None:
            self._fifo.appendleft(seq)
        else:
            heapq.heappush(self._heap, (self._key(seq), -next(self._front_counter), seq))

    def peek(self) -> Sequence:
        return self._fifo[0] if self._key is None else self._heap[0][2]

    def pop(self) -> Sequence:
        return self._fifo.popleft() if self._key is None else heapq.heappop(self._heap)[2]

    def remove(self, seq: Sequence) -> None:
        if self._key is None:
            self._fifo.remove(seq)
        else:
            self._heap = [e for e in self._heap if e[2] is not seq]
            heapq.heapify(self._heap)

    def rekey(self) -> None:
        """Re-evaluate every key (time-dependent keys: once per step, O(n log n))."""
        if self._key is not None:
            self._heap = [(self._key(s), c, s) for _, c, s in self._heap]
            heapq.heapify(self._heap)

    def __iter__(self) -> Iterable[Sequence]:
        return iter(self._fifo) if self._key is None else (e[2] for e in sorted(self._heap))

    def __len__(self) -> int:
        return len(self._fifo) if self._key is None else len(self._heap)


#: The hooks an arrival's step with the decodes in bulk skips or stands in for.
BULK_SKIPS = ("schedule", "_schedule_running", "running_order", "may_preempt_for", "schedule_arrivals")


@functools.cache
def _declared_with_its_hooks(cls: type) -> bool:
    """Whether the class that declares ``arrivals_beside_decodes`` for ``cls`` is (a subclass of)
    every class that defines one of :data:`BULK_SKIPS`, and ``schedule_arrivals`` is overridden
    wherever ``schedule`` is."""
    def owner(name: str) -> type:
        return next(k for k in cls.__mro__ if name in k.__dict__)

    declared = owner("arrivals_beside_decodes")
    return (all(issubclass(declared, owner(name)) for name in BULK_SKIPS)
            and issubclass(owner("schedule_arrivals"), owner("schedule")))


class QueueScheduler(Scheduler):
    """Base class implementing the unified loop; subclasses override the policy methods."""

    #: True: :meth:`waiting_key` returns ``key(seq, now)`` (``now`` on the scheduler's clock, as
    #: ``seq.arrival_s``) and the waiting queue is re-sorted by it at the start of every
    #: :meth:`schedule` — for orders that change while requests wait. A queue of
    #: :meth:`make_waiting_queue` then needs a ``rekey()`` method. May be a property of the config.
    if TYPE_CHECKING:  # read-only to the type checker, so a subclass may override it with a property
        @property
        def time_dependent_key(self) -> bool:
            return False
    else:  # a plain class attribute at run time
        time_dependent_key = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.now = 0.0  # the ``now`` of the current (else the last) schedule(), for hooks without one
        self.waiting = self.make_waiting_queue()
        self.running: list[Sequence] = []
        self.swapped: deque[Sequence] = deque()
        # Asynchronous loads through the connector: waiting for blocks (FIFO), loading (id -> (seq, tokens)),
        # and the ids of landed sequences back in the waiting queue holding blocks for all their tokens
        self.connector = getattr(self.context, "connector", None)
        self.kv_waiting: deque[Sequence] = deque()
        self.kv_loading: dict[str, tuple[Sequence, int]] = {}
        self.kv_held: dict[str, Sequence] = {}  # landed sequences waiting for a seat, in landing order
        self._prefill_left = self._prefill_cap = 0  # prefill tokens this step may (still) take
        self._drafts_left = 0  # draft tokens this step may (still) verify

    # ---- policy hooks -------------------------------------------------------------------
    def waiting_key(self) -> Callable[..., Any] | None:
        """A function ``seq -> sortable`` ordering the waiting queue (smallest first), or None for
        FIFO; ``(seq, now) -> sortable`` when :attr:`time_dependent_key` is set."""
        return None

    def make_waiting_queue(self) -> Any:
        """The waiting queue: anything with WaitQueue's methods (push, push_front, peek, pop,
        __len__, __iter__). Default: a :class:`WaitQueue` ordered by :meth:`waiting_key`."""
        key = self.waiting_key()
        if key is not None and self.time_dependent_key:
            timed = key
            key = lambda seq: timed(seq, self.now)  # noqa: E731
        return WaitQueue(key)

    def running_order(self, running: list[Sequence], now: float) -> list[Sequence]:
        """Order in which running sequences get the budget; the last one is preempted first."""
        return running

    def may_admit(self, seq: Sequence, now: float) -> bool:
        """Whether ``seq`` (the head of the waiting queue) may start now. Default: yes."""
        return True

    def may_preempt_for(self, seq: Sequence, victim: Sequence) -> bool:
        """Whether waiting ``seq`` may preempt running ``victim`` to get blocks, or its seat when
        ``max_num_seqs`` sequences run. Default: no."""
        return False

    def prefill_token_cap(self, now: float) -> int:
        """How many prefill tokens (prompt chunks, recomputation) this step may take in all;
        decodes are not counted. Default: the whole step budget (no extra cap). With chunked
        prefill off a prompt larger than what is left waits for a later step."""
        return self.limits.max_num_batched_tokens

    def draft_token_cap(self, now: float) -> int:
        """How many draft tokens (speculative decoding) this step may verify in all. Default: no
        cap beyond the token budget, which running decodes and their drafts take first; a policy
        that protects prefill under load returns less (0 = verify nothing this step)."""
        return self.limits.max_num_batched_tokens

    def on_admit(self, seq: Sequence, now: float) -> None:
        """``seq`` left the waiting queue and runs from this step (its first admission, or again
        after a recompute preemption: ``seq.num_preemptions > 0``; a swap-in is not an admission).
        For policies that account service at admission (fair sharing, quanta). Default: nothing."""

    def running_sorted_by(self, key: Callable[[Sequence], Any]) -> bool:
        """Whether :attr:`running` (the last plan's order) is already in ``key`` order, so that a
        stable sort by ``key`` at the next step leaves it as it is: what the :meth:`next_decision`
        of a policy whose :meth:`running_order` sorts checks first."""
        keys = list(map(key, self.running))
        return all(map(operator.le, keys, keys[1:]))

    def arrivals_beside_decodes(self) -> bool:
        """Whether the simulator's fast-forward may take an arrival's step with the running decodes
        in bulk (:func:`servelab.engine.fast_forward.arrival_step`): asked when a span of quiet
        steps stopped for an arrival inside this scheduler's :meth:`next_decision` horizon and
        requests were added since (nothing else). True promises that then :meth:`schedule` would
        give every running sequence, in the last plan's order, one decode token first, preempt
        nobody for a waiting sequence (:meth:`may_preempt_for` is never true), and that
        :meth:`schedule_arrivals` does the rest of it exactly: a subclass that overrides
        :meth:`schedule` overrides :meth:`schedule_arrivals` alike. It also promises that ``add``,
        :meth:`next_decision` and :meth:`schedule_arrivals` read no running sequence's tokens or
        token times: while a span is kept they may lag (they are brought up to date at their own
        events), and the counts ``schedule_arrivals`` gets are exact. Default False (always correct:
        the arrival's step is scheduled in full); a wrong True changes results, which
        ``servelab check-plugin`` (fast-forward on against off) names."""
        return False

    def may_take_decodes_in_bulk(self, num_decodes: int) -> bool:
        """Whether this scheduler's state lets :meth:`schedule_arrivals` stand in for :meth:`schedule`
        with ``num_decodes`` running decodes (no side effects): they are all it runs, nothing is
        swapped or loading, the budget outlasts them, and no prompt-only step comes first; and the
        class that declares :meth:`arrivals_beside_decodes` saw every hook the bulk path skips (a
        subclass of a declaring scheduler that changes the running phase keeps the full step)."""
        limits = self.limits
        return (_declared_with_its_hooks(type(self))
                and len(self.running) == num_decodes and num_decodes < limits.max_num_batched_tokens
                and not self.swapped and not self.kv_waiting and not self.kv_loading and not self.kv_held
                and (limits.chunked_prefill or limits.non_chunked_schedule != "prefill_first"))

    def schedule_arrivals(self, now: float, num_decodes: int, context: int) -> SchedulePlan:
        """:meth:`schedule` for a step whose ``num_decodes`` running sequences (``context`` tokens in
        all) each decode one token, in the last plan's order, with their slots allocated by the
        engine (fast-forward, :meth:`arrivals_beside_decodes`): returns the plan's other entries
        (admissions), leaving this scheduler as :meth:`schedule` would."""
        self.now = now
        if self.time_dependent_key:
            self.waiting.rekey()
        plan = SchedulePlan()
        self._prefill_left = self._prefill_cap = max(0, self.prefill_token_cap(now))
        self._drafts_left = max(0, self.draft_token_cap(now))
        self._admit(plan, [], self.limits.max_num_batched_tokens - num_decodes, now)
        return plan

    def step_stats(self) -> dict[str, float]:
        """Numbers about the last :meth:`schedule` call for the step log (``steps.jsonl``)."""
        return {"prefill_cap": self._prefill_cap}

    # ---- the interface ------------------------------------------------------------------
    def add(self, seq: Sequence) -> None:
        connector = self.connector
        if connector is not None:  # only an asynchronous push is claimed on arrival; the rest is asked at admission
            _, load_async = connector.get_num_new_matched_tokens(seq, self.allocator.cached_prefix_len(seq))
            if load_async:
                self.kv_waiting.append(seq)
                self._start_kv_loads()
                return
        self.waiting.push(seq)

    def on_kv_loaded(self, seq: Sequence) -> None:
        _, n = self.kv_loading.pop(seq.id)
        self.allocator.mark_loaded(seq, n)
        self.kv_held[seq.id] = seq
        self.waiting.push(seq)  # seated first, in landing order (_seat_held); the policy orders the rest

    def remove(self, seq: Sequence) -> None:
        if seq in self.running:
            self.running.remove(seq)

    def abort(self, seq: Sequence) -> None:
        """Take ``seq`` out of whichever queue holds it, then :meth:`remove` (subclass bookkeeping).
        A custom waiting queue (:meth:`make_waiting_queue`) needs a ``remove(seq)`` method for this."""
        if seq.status is Status.SWAPPED:
            self.swapped.remove(seq)
        elif seq.status is Status.WAITING and seq in self.kv_waiting:
            self.kv_waiting.remove(seq)
        elif seq.status is Status.WAITING and seq.id in self.kv_loading:
            del self.kv_loading[seq.id]  # the engine frees its blocks; the connector's answer is ignored
        elif seq.status is Status.WAITING and any(s is seq for s in self.waiting):
            self.waiting.remove(seq)
            self.kv_held.pop(seq.id, None)  # the engine frees its blocks
        self.remove(seq)

    def num_unfinished(self) -> int:
        return len(self.waiting) + len(self.running) + len(self.swapped) + len(self.kv_waiting) + len(self.kv_loading)

    def queue_lengths(self) -> dict[str, int]:
        queues = {"waiting": len(self.waiting), "running": len(self.running),
                  "swapped": len(self.swapped)}
        if self.connector is not None:  # waiting for blocks or for their KV to land
            queues["loading"] = len(self.kv_waiting) + len(self.kv_loading)
        return queues

    def schedule(self, now: float) -> SchedulePlan:
        """Three phases: running sequences keep going, swapped ones come back, waiting ones are
        admitted. With chunked prefill off and ``non_chunked_schedule=prefill_first`` (vLLM v0's
        ``_schedule_default``) admission comes first instead: when prompts wait and nothing is
        swapped, waiting prompts are admitted whole into the full budget and, if any was, the step
        is prompt-only (running decodes pause for it); otherwise the step runs the running
        sequences, then swap-ins, and admits nobody."""
        self.now = now
        if self.kv_waiting:
            self._start_kv_loads()
        if self.time_dependent_key:
            self.waiting.rekey()
        plan = SchedulePlan()
        self._prefill_left = self._prefill_cap = max(0, self.prefill_token_cap(now))
        self._drafts_left = max(0, self.draft_token_cap(now))
        self.running = self.running_order(self.running, now)
        scheduled: list[Sequence] = []
        prefill_first = not self.limits.chunked_prefill and self.limits.non_chunked_schedule == "prefill_first"
        if prefill_first and self.waiting and not self.swapped:
            self._admit(plan, scheduled, self.limits.max_num_batched_tokens, now)
            if plan.scheduled:
                return plan
        budget = self._schedule_running(plan, scheduled, self.limits.max_num_batched_tokens)
        if not plan.preempted:
            self._swap_in(plan)
        if self.kv_held:  # landed sequences hold blocks for every token: they run first, in landing order,
            budget = self._seat_held(plan, scheduled, budget, now)  # so idle KV never waits behind the queue
        if not self.swapped and not prefill_first:
            self._admit(plan, scheduled, budget, now)
        return plan

    # ---- the three phases ---------------------------------------------------------------
    def _schedule_running(self, plan: SchedulePlan, scheduled: list[Sequence], budget: int) -> int:
        """Decodes (with drafts) and unfinished prompt chunks of running sequences, in
        :meth:`running_order`; preempts from the back of that order when blocks run out. Returns
        the budget left."""
        i = 0
        running, allocator = self.running, self.allocator
        while i < len(running) and budget > 0:
            seq = running[i]
            computed = seq.num_computed_tokens
            if seq.num_tokens - computed == 1 and computed >= seq.request.prompt_len:
                n = 1  # a decode: the common case, kept free of calls
                if seq.draft_token_ids and budget > 1 and self._verify(seq, budget, plan):
                    scheduled.append(seq)
                    budget -= plan.scheduled[-1].num_tokens
                    i += 1
                    continue
                if allocator.allocate_slots(seq, 1):
                    plan.scheduled.append(ScheduledSeq(seq, 1, computed))
                    scheduled.append(seq)
                    budget -= 1
                    i += 1
                    continue
            else:
                n = self._chunk(seq, budget)
            if n == 0:
                i += 1
                continue
            while not allocator.allocate_slots(seq, n):
                victim = self.preemption.select_victim(running[i:])
                self._preempt(victim, plan)
                if victim is seq:
                    break
            else:
                self._take(seq, n, plan, scheduled)
                budget -= n
                i += 1
        return budget

    def _swap_in(self, plan: SchedulePlan) -> None:
        """Swapped sequences come back (in order, while blocks and seats allow) before anyone new
        is admitted."""
        while self.swapped and self.allocator.can_swap_in(self.swapped[0]):
            if len(self.running) >= self.limits.max_num_seqs:
                break
            seq = self.swapped.popleft()
            plan.swap_in.extend(self.allocator.swap_in(seq))
            seq.status = Status.RUNNING
            self.running.append(seq)

    def _start_kv_loads(self) -> None:
        """Sequences whose KV an asynchronous source pushes claim blocks for all their tokens, in
        arrival order, and start their loads; the first one the pool cannot take stops the rest
        (back-pressure: it retries at the next :meth:`schedule`). No side effects when it does not fit."""
        allocator, connector, queue = self.allocator, self.connector, self.kv_waiting
        assert connector is not None, "only a connector puts sequences in kv_waiting"
        while queue:
            seq = queue[0]
            cached = allocator.cached_prefix_len(seq)
            if not allocator.can_allocate(seq, seq.num_tokens - cached, cached):
                return
            hit = allocator.start_sequence(seq)  # a prefix cached here is not loaded
            if not allocator.allocate_slots(seq, seq.num_tokens - hit):  # an optimistic can_allocate
                allocator.reset(seq)
                return
            queue.popleft()
            if seq.num_preemptions == 0 and seq.num_output_tokens == 0:  # a new request (a tier's load), not
                seq.num_cached_prompt_tokens = hit  # a hand-off, which carries its prefill's hit: as _admit counts
            n, load_async = connector.get_num_new_matched_tokens(seq, hit)
            connector.update_state_after_alloc(seq, allocator.block_table(seq.id), n)
            self.kv_loading[seq.id] = (seq, n)
            if not load_async:  # in place before the next forward pass
                self.on_kv_loaded(seq)

    # ---- mechanics ----------------------------------------------------------------------
    def _verify(self, seq: Sequence, budget: int, plan: SchedulePlan) -> bool:
        """Schedule decode ``seq`` with as many of its drafts as the budget, :meth:`draft_token_cap`
        and free blocks allow (drafts never preempt anyone); False if none fit."""
        n = min(len(seq.draft_token_ids), budget - 1, self._drafts_left)
        if n <= 0 or not self.allocator.allocate_slots(seq, 1 + n):
            return False
        self._drafts_left -= n
        plan.scheduled.append(ScheduledSeq(seq, 1 + n, seq.num_computed_tokens, tuple(seq.draft_token_ids[:n])))
        return True

    def _chunk(self, seq: Sequence, budget: int, computed: int | None = None) -> int:
        """Tokens ``seq`` computes now (``computed`` of its tokens are, default its
        ``num_computed_tokens``): all it has, or a chunk when chunked prefill is on."""
        if computed is None:
            computed = seq.num_computed_tokens
        n = seq.num_tokens - computed
        if n == 1 and computed >= seq.request.prompt_len:
            return 1  # a decode (budget > 0 here)
        budget = min(budget, self._prefill_left)
        if n <= budget:
            return n
        return budget if self.limits.chunked_prefill else 0

    def _take(self, seq: Sequence, n: int, plan: SchedulePlan, scheduled: list[Sequence]) -> None:
        """Put ``n`` tokens of ``seq`` (blocks already allocated) into the plan."""
        if n > 1 or seq.num_computed_tokens < seq.request.prompt_len:
            self._prefill_left -= n
        plan.scheduled.append(ScheduledSeq(seq, n, seq.num_computed_tokens))
        scheduled.append(seq)

    def _admit(self, plan: SchedulePlan, scheduled: list[Sequence], budget: int, now: float) -> int:
        """Waiting sequences, in the waiting queue's order, while budget, seats and blocks allow;
        the connector is asked about each as it comes up (see the module's docstring)."""
        allocator, connector, held = self.allocator, self.connector, self.kv_held
        while self.waiting and budget > 0:
            seq = self.waiting.peek()
            if not self.may_admit(seq, now):
                break
            self.waiting.pop()  # before any preemption, which puts its victim back in the queue
            if len(self.running) >= self.limits.max_num_seqs and not self._free_seat_for(seq, plan, scheduled):
                self.waiting.push_front(seq)
                break
            if held and seq.id in held:  # an asynchronous load landed: its blocks cover every token
                n = self._chunk(seq, budget)
                if n == 0:
                    self.waiting.push_front(seq)
                    break
                self._seat_landed(seq, n, plan, scheduled, now)
                budget -= n
                continue
            # Ask first, touch nothing: a head of line that does not fit retries next step without
            # referencing its cached prefix (no evictor hears of a use that did not happen).
            cached = allocator.cached_prefix_len(seq)
            external = 0
            if connector is not None:
                external, load_async = connector.get_num_new_matched_tokens(seq, cached)
                if load_async:  # a source that answers asynchronously now: it loads without a seat
                    self.kv_waiting.append(seq)
                    self._start_kv_loads()
                    continue
            n = self._chunk(seq, budget, cached + external)
            if n == 0 or not self._room_for_waiting(seq, external + n, cached, plan, scheduled):
                self.waiting.push_front(seq)
                if held:
                    budget = self._seat_held(plan, scheduled, budget, now)
                break
            hit = allocator.start_sequence(seq)
            if hit != cached:  # an allocator whose admit and cached_prefix_len disagree
                if connector is not None:
                    external, _ = connector.get_num_new_matched_tokens(seq, hit)
                n = self._chunk(seq, budget, hit + external)
            if n == 0 or not allocator.allocate_slots(seq, external + n):  # an optimistic can_allocate: undo
                allocator.reset(seq)
                self.waiting.push_front(seq)
                break
            if external:  # the allocation may have evicted GPU blocks into a full tier, which dropped some
                assert connector is not None
                now_external, _ = connector.get_num_new_matched_tokens(seq, hit)
                if now_external != external:
                    external = now_external
                    n = self._chunk(seq, budget, hit + external)
                    if n == 0 or not allocator.allocate_slots(seq, external + n):
                        allocator.reset(seq)
                        self.waiting.push_front(seq)
                        break
            if connector is not None:  # told of every admission; a synchronous load is in place before
                connector.update_state_after_alloc(seq, allocator.block_table(seq.id), external)  # the forward pass
                if external:
                    allocator.mark_loaded(seq, external)
            if seq.num_preemptions == 0 and seq.num_output_tokens == 0:  # the hit rate counts first admissions
                seq.num_cached_prompt_tokens = hit  # only (a hand-off carries its prefill's hit)
            self._seat(seq, n, plan, scheduled, now)
            budget -= n
        return budget

    def _seat(self, seq: Sequence, n: int, plan: SchedulePlan, scheduled: list[Sequence], now: float) -> None:
        """``seq`` (blocks allocated for its next ``n`` tokens) runs from this step."""
        seq.status = Status.RUNNING
        if seq.first_scheduled_time is None:
            seq.first_scheduled_time = now
        self.running.append(seq)
        self._take(seq, n, plan, scheduled)
        self.on_admit(seq, now)

    def _seat_landed(self, seq: Sequence, n: int, plan: SchedulePlan, scheduled: list[Sequence], now: float) -> None:
        self.kv_held.pop(seq.id, None)
        if not self.allocator.allocate_slots(seq, n):  # covered by the load's allocation
            raise RuntimeError(f"sequence {seq.id!r} landed without blocks for its next {n} tokens")
        self._seat(seq, n, plan, scheduled, now)

    def _seat_held(self, plan: SchedulePlan, scheduled: list[Sequence], budget: int, now: float) -> int:
        """Landed sequences (asynchronous loads, holding blocks for every token) run before anyone
        is admitted, in landing order, while seats and budget allow."""
        for seq in list(self.kv_held.values()):
            if budget <= 0 or len(self.running) >= self.limits.max_num_seqs:
                break
            n = self._chunk(seq, budget)
            if n == 0:
                break
            self.waiting.remove(seq)
            self._seat_landed(seq, n, plan, scheduled, now)
            budget -= n
        return budget

    def _free_seat_for(self, seq: Sequence, plan: SchedulePlan, scheduled: list[Sequence]) -> bool:
        """Preempt one running sequence that :meth:`may_preempt_for` allows, to seat ``seq``."""
        candidates = [s for s in self.running if self.may_preempt_for(seq, s)]
        if not candidates:
            return False
        self._evict(self.preemption.select_victim(candidates), plan, scheduled)
        return True

    def _room_for_waiting(self, seq: Sequence, n: int, cached: int, plan: SchedulePlan,
                          scheduled: list[Sequence]) -> bool:
        """Whether ``n`` tokens of waiting ``seq`` (``cached`` of its tokens in the prefix cache) fit,
        preempting running sequences that :meth:`may_preempt_for` allows until they do."""
        while not self.allocator.can_allocate(seq, n, cached):
            candidates = [s for s in self.running if self.may_preempt_for(seq, s)]
            if not candidates:
                return False
            self._evict(self.preemption.select_victim(candidates), plan, scheduled)
        return True

    def _evict(self, victim: Sequence, plan: SchedulePlan, scheduled: list[Sequence]) -> None:
        """Preempt ``victim``, first taking back what it was granted this step."""
        if victim in scheduled:
            entry = next(e for e in plan.scheduled if e.seq is victim)
            plan.scheduled.remove(entry)
            scheduled.remove(victim)
        self._preempt(victim, plan)

    def _preempt(self, victim: Sequence, plan: SchedulePlan) -> None:
        decision: PreemptionDecision = self.preemption.decide(victim)
        decision.num_computed_tokens = victim.num_computed_tokens
        self.running.remove(victim)
        victim.num_preemptions += 1
        # No swap-out in a plan that swaps in: the executor copies out first, so a host block
        # released by this plan's swap-in could be overwritten before it is read.
        if decision.kind == "swap" and not plan.swap_in and self.allocator.can_swap_out(victim):
            plan.swap_out.extend(self.allocator.swap_out(victim))
            victim.status = Status.SWAPPED
            self.swapped.append(victim)
        else:
            if decision.kind != "recompute":
                decision = PreemptionDecision(victim.id, "recompute", f"fallback: {decision.kind} impossible",
                                              decision.estimates, victim.num_computed_tokens)
            self.allocator.reset(victim)
            victim.status = Status.WAITING
            self.waiting.push_front(victim)
        plan.preempted.append(decision)
