"""The engine: continuous (iteration-level) batching around one unified step.

``step()`` composes the engine's public step phases, one way down (nano-vllm's step, with a clock)::

    plan   = engine.schedule(start)                  # the policies decide; blocks are allocated
    work   = step_work(plan)                         # the step as numbers (time models price it)
    output = engine.execute(plan, work)              # executor.execute(batch), or execute_work(work)
    end    = engine.price(work)                      # the clock ends the step (virtual: the time model's price)
    engine.apply(plan, output, end)                  # tokens, computed counts, finishes
    return engine.record(plan, work, start, end)     # the totals, the policies' cost model, step listeners

A multi-step window (:mod:`servelab.engine.multi_step`) and a fast-forward span
(:mod:`servelab.engine.fast_forward`) drive the same phases: there is one :meth:`Engine.apply`, and
nothing but it and the allocator writes ``seq.num_computed_tokens`` (``tests/test_step_phases.py``).

With a KV connector (:mod:`servelab.core.kv_connector`) a step starts by taking its finished sends
(kept blocks are freed) and loads (the scheduler may run those sequences), the connector's worker
side moves loads in before the forward pass and starts sends after it, and a sequence that ends
is asked about (``request_finished``): its blocks stay while the connector still reads them.

The engine reads each scheduled sequence's block table from the allocator and puts it in the
batch: below the engine nothing calls a policy plugin. Requests join at any step boundary once
they have arrived and leave as soon as they finish.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Callable, Iterable, TypeVar

from servelab.core.cost_model import StepCostModel
from servelab.core.executor import Executor, StepOutput
from servelab.core.kv_connector import KVConnector
from servelab.core.interfaces import (BlockAllocator, Drafts, EngineLimits, EvictorError, LengthPredictorError,
                                      PreemptionDecision, Scheduler, ScheduledSeq, SchedulePlan, SpeculativeDrafter)
from servelab.core.request import Request, Sequence, Status
from servelab.core.step_work import DraftWork, StepWork
from servelab.engine.batch import build_batch, step_work
from servelab.engine.clock import Clock, WallClock, price_kv_transfer
from servelab.engine.fast_forward import (Span, arrival_step, fast_forward, may_precede_span, resume,
                                          takes_arrivals_in_bulk)
from servelab.engine.frontend import FrontEnd
from servelab.engine.multi_step import run_window, starts_window
from servelab.engine.step_totals import StepTotals
from servelab.engine.timeline import StepTimeline


log = logging.getLogger(__name__)

_T = TypeVar("_T")


class PluginFailure(RuntimeError):
    """A policy plugin raised; the message names the plugin and the step."""


@dataclass
class StepRecord:
    """What one step did and how long it took (one line of ``steps.jsonl``).

    ``queues``, ``scheduled`` and ``scheduler`` are filled only while someone reads the records
    (the engine's ``keep_steps``, or a step listener); otherwise they are empty.
    """

    step: int
    time_s: float
    duration_s: float
    model_s: float
    num_seqs: int
    num_tokens: int
    prefill_tokens: int
    decode_seqs: int
    kv_utilization: float
    queues: dict[str, int]
    comm_s: float = 0.0  # time in cross-rank communication (tensor parallel); not counted in model_s
    preempted: list[PreemptionDecision] = field(default_factory=list)
    extra: dict[str, float] = field(default_factory=dict)
    scheduled: list[tuple[str, int]] = field(default_factory=list)  # (request id, tokens) in plan order
    scheduler: dict[str, float] = field(default_factory=dict)  # the scheduler's step_stats()
    swap_out_blocks: int = 0
    swap_in_blocks: int = 0
    work: StepWork | None = None  # the step's features, as time models see them
    draft_tokens: int = 0  # speculative drafts verified this step
    draft_s: float = 0.0  # drafting the next step's tokens (in duration_s; on the virtual clock: the time model's price)
    accepted_tokens: int = 0  # of which the target kept


class Engine:
    """Owns every sequence; asks the scheduler for a plan, the executor for tokens, and applies them."""

    def __init__(self, limits: EngineLimits, scheduler: Scheduler, allocator: BlockAllocator,
                 executor: Executor, cost_model: StepCostModel, seed: int = 0,
                 clock: Clock | None = None, drafter: SpeculativeDrafter | None = None,
                 connector: KVConnector | None = None) -> None:
        self.limits = limits
        self.scheduler = scheduler
        self.allocator = allocator
        self.executor = executor
        self.cost_model = cost_model
        self.drafter = drafter if drafter is not None and drafter.num_speculative_tokens > 0 else None
        self._drafter_runs_model = bool(getattr(self.drafter, "runs_model", False))
        self._drafter_warned: set[str] = set()
        self.seed = seed
        self.eos_token_ids = frozenset(executor.spec.eos_token_ids)
        self.clock: Clock = clock if clock is not None else WallClock()
        self._t0 = self.clock.now()
        self.sequences: dict[str, Sequence] = {}
        self.num_ended = 0  # finished or rejected
        self.steps: list[StepRecord] = []  # every step's record while ``keep_steps``
        self.keep_steps = True
        self.totals = StepTotals()  # what the summary needs, whether or not the steps are kept
        self.timeline: StepTimeline | None = StepTimeline()  # a few numbers a step, for `servelab report`
        self._waiting = 0  # sequences held but not in the step being run (the timeline's)
        # Told of each step's record. A listener whose function has ``reads_step_details = False``
        # reads only the numbers, so the record's queues, plan entries and scheduler stats stay empty.
        self.step_listeners: list[Callable[[StepRecord], None]] = []
        # Told of each sequence as it ends (finished or rejected). With ``forget_ended`` the engine
        # then drops it (a listener has recorded it): long runs hold only live sequences.
        self.end_listeners: list[Callable[[Sequence], None]] = []
        self.forget_ended = False
        self._forgotten: set[str] = set()
        # The one door for KV entering or leaving (servelab.core.kv_connector; None: none does).
        # A finished sequence whose blocks it still reads is kept in _sending until it says sent.
        self.connector = connector
        self._sending: dict[str, Sequence] = {}
        # sim.fast_forward: after a decodes-only step, the drivers may run the quiet steps that
        # follow in one go (servelab.engine.fast_forward); off: every step is scheduled.
        self.fast_forward_enabled = False
        self.frontend: FrontEnd | None = None  # frontend=...: token timestamps as the client gets them
        self._quiet_plan: SchedulePlan | None = None
        # a fast-forward span kept for the next arrival's step, or to go on; in a cluster maybe paused
        # (its sequences not up to date: fast_forward(resumable=True), settle_span)
        self._span: Span | None = None
        self.num_fast_forwarded = 0  # steps run by fast_forward (of totals.num_steps)
        self.num_bulk_arrival_steps = 0  # steps that took a span's decodes in bulk beside arrivals (of the rest)
        self.last_step_s = 0.0  # the duration of the last step on this engine's clock

    def now(self) -> float:
        """Seconds since the engine started."""
        return self.clock.now() - self._t0

    def reset_clock(self, origin: float | None = None) -> None:
        """Count from now, or from ``origin`` on the clock (engine processes of one wall-clock cluster
        share their parent's start: :mod:`servelab.cluster.procs.engine`)."""
        self._t0 = self.clock.now() if origin is None else origin

    def sleep(self, seconds: float) -> None:
        """Wait idle for up to ``seconds`` (the clock decides: a nap, or a jump in virtual time)."""
        self.clock.sleep(seconds)

    # ---- requests -----------------------------------------------------------------------
    def add_request(self, request: Request, arrival_s: float | None = None) -> Sequence:
        """Admit a request to the scheduler, or reject it (with a reason) if it can never run.

        ``arrival_s`` is its arrival in engine seconds (SLO deadlines count from it); default
        ``request.arrival_time`` (a time scale of 1).
        """
        if request.id in self.sequences or request.id in self._forgotten:
            raise ValueError(f"duplicate request id {request.id!r}")
        seq = Sequence(request, arrival_s=request.arrival_time if arrival_s is None else arrival_s)
        span = self._span
        if span is not None:
            if takes_arrivals_in_bulk(self.scheduler):
                span.paused = False  # it goes on only through the arrival's step, beside its lag
            else:
                span.settle()
        self.sequences[request.id] = seq
        self._quiet_plan = None
        reason = self._rejection_reason(request)
        if reason:
            seq.reject(reason, self.now())
            self._ended(seq)
        else:
            self.call_plugin("scheduler", lambda: self.scheduler.add(seq))
        return seq

    def rejection_reason(self, request: Request) -> str | None:
        """Why ``request`` would be rejected on arrival, or None (``strict_requests`` asks up front)."""
        return self._rejection_reason(request)

    def _rejection_reason(self, request: Request) -> str | None:
        if request.prompt_len == 0:
            return "empty prompt"
        if request.max_tokens < 1:
            return f"max_tokens={request.max_tokens} < 1"
        if request.prompt_len >= self.limits.max_model_len:
            return (f"prompt of {request.prompt_len} tokens leaves no room to generate within "
                    f"max_model_len={self.limits.max_model_len}")
        vocab = self.executor.spec.vocab_size
        low, high = request.token_id_bounds
        if low < 0 or high >= vocab:
            return f"prompt token id outside the vocabulary [0, {vocab})"
        needed = min(request.prompt_len + request.max_tokens, self.limits.max_model_len)
        if not self.allocator.can_ever_fit(needed):
            blocks = -(-needed // self.limits.block_size)
            return (f"needs {needed} KV slots ({blocks} blocks of {self.limits.block_size}) but the whole pool "
                    f"has {self.allocator.num_blocks} blocks")
        return None

    def add_sequence(self, seq: Sequence) -> None:
        """Take over a live sequence made elsewhere (it may carry output tokens already, e.g. the
        first token a prefill engine sampled): the scheduler gets it like an arrival. Whether its KV
        comes from outside is the connector's answer to the scheduler. The caller checked that it
        can run here (:meth:`rejection_reason`)."""
        if seq.id in self.sequences or seq.id in self._forgotten:
            raise ValueError(f"duplicate request id {seq.id!r}")
        self._drop_span()
        self.sequences[seq.id] = seq
        self._quiet_plan = None
        self.call_plugin("scheduler", lambda: self.scheduler.add(seq))

    def poll_connector(self) -> None:
        """Take the connector's finished sends (free the blocks kept for them) and loads (the
        scheduler may run those sequences). The engine does this at the start of every step; a
        driver that knows a transfer just completed may call it between steps."""
        if self.connector is None:
            return
        sent, received = self.connector.get_finished()
        for request_id in sent:
            self.allocator.free(self._sending.pop(request_id))
        for request_id in received:
            seq = self.sequences[request_id]
            self.call_plugin("scheduler", lambda: self.scheduler.on_kv_loaded(seq))  # called at once: no late binding

    def forget(self, request_id: str) -> None:
        """Drop the record of an ended sequence whose blocks are free, so that ``request_id`` may be
        added again (a request that migrated away and comes back: :mod:`servelab.cluster.migration`).
        A live sequence, or one whose blocks the connector still reads, is a ValueError."""
        seq = self.sequences.get(request_id)
        if (seq is not None and not seq.is_finished) or request_id in self._sending:
            raise ValueError(f"request {request_id!r} is live here or its KV is still being sent: not forgotten")
        self.sequences.pop(request_id, None)
        self._forgotten.discard(request_id)

    def has_unfinished(self) -> bool:
        return self.scheduler.num_unfinished() > 0

    def abort(self, request_id: str) -> bool:
        """End a live request now, whatever its state (waiting, running mid-prefill or decoding,
        swapped, holding drafts): the scheduler forgets it, its blocks (swapped ones in the host
        pool too) go back, the drafter forgets it, and it is recorded with ``finish_reason="abort"``.
        Call between steps (the server's engine thread does). Returns False when the request is
        unknown or has already ended."""
        return self._end_early(request_id, "abort")

    def stop(self, request_id: str) -> bool:
        """End a live request as finished with ``finish_reason="stop"`` (a stop string matched
        outside the engine, e.g. in the server's detokenizer); otherwise like :meth:`abort`."""
        return self._end_early(request_id, "stop")

    def _end_early(self, request_id: str, reason: str) -> bool:
        seq = self.sequences.get(request_id)
        if seq is None or seq.is_finished:
            return False
        self._drop_span()
        self._quiet_plan = None
        before = self.scheduler.num_unfinished()
        self.call_plugin("scheduler", lambda: self.scheduler.abort(seq))
        if self.scheduler.num_unfinished() != before - 1:
            raise PluginFailure(f"scheduler plugin {type(self.scheduler).name!r} still holds aborted request "
                                f"{request_id!r} ({seq.status.value}): its abort()/remove() must forget a sequence "
                                "in any state (QueueScheduler does)")
        self._retire(seq, reason, self.now())
        return True

    # ---- the step -----------------------------------------------------------------------
    def step(self) -> StepRecord | None:
        """One iteration, composed of the step phases below: schedule -> execute -> price -> apply
        (-> draft) -> record. Returns the step's record, or None if nothing could run. With
        ``num_scheduler_steps`` N > 1 a decode-only plan opens a window of up to N decode steps run
        without the scheduler, its tokens delivered at its end (:mod:`servelab.engine.multi_step`);
        the last step's record is returned. After a fast-forward span that stopped for an arrival,
        a scheduler that declares it (``arrivals_beside_decodes``) has the step's decodes taken in
        bulk (:func:`servelab.engine.fast_forward.arrival_step`): the same phases, the same results."""
        start = self.now()
        span, self._span = self._span, None
        if span is not None:
            if self._can_fast_forward() and takes_arrivals_in_bulk(self.scheduler):  # its decodes in bulk
                record, self._span = arrival_step(self, span, start)
                if record is not None:
                    self._quiet_plan = None  # a span goes on from self._span
                    self.num_bulk_arrival_steps += 1
                    return record
            span.settle()  # its sequences up to date for the full step
        plan = self.schedule(start)
        if plan.is_empty:
            return None
        self.count_waiting(len(plan.scheduled))
        if self.limits.num_scheduler_steps > 1 and self.drafter is None and starts_window(plan):
            return run_window(self, plan, start, self.limits.num_scheduler_steps)
        work = step_work(plan)  # before apply: it reads the sequences as the plan saw them
        output = self.execute(plan, work)
        computed = self.price(work)
        grew = self.apply(plan, output, computed, stamp=self.deliver(computed, len(output.sampled)))
        end = self.draft(grew, computed)  # the next step's drafts are part of this step's time
        return self.record(plan, work, start, end, output, draft_s=end - computed)

    def fast_forward(self, until: float = float("inf"), on_step_start: Callable[[], None] | None = None,
                     stop_after_end: bool = False, resumable: bool = False) -> int:
        """Run, at once, the quiet decode steps that may follow the step just taken and start
        before ``until`` (engine seconds: the next arrival), exactly as :meth:`step` would run them
        (:mod:`servelab.engine.fast_forward`); returns how many (0 when fast-forward is off, a
        sequence still has prompt to compute or waits, or this engine cannot: not the simulator on a virtual
        clock, ``num_scheduler_steps`` > 1, a drafter, a KV connector, an allocator without quiet steps, per-step details read).
        ``on_step_start`` is called before each of those steps but the quiet ones after a quiet one:
        the first, each in which a sequence takes a block or ends, and each after one (a cluster keeps
        its router's gauges and tells ends as of their step's start; a quiet step changes neither).
        ``stop_after_end``: stop after a step in which a request ended (a closed-loop client's next
        arrival becomes known only then).
        It may be called again without a step in between while nothing reached this engine: it goes
        on from where it stopped (a request added since makes it wait for the arrival's step, one
        aborted makes it decline). A span that stopped at ``until`` is kept, its running sequences
        not yet given the tokens of its quiet steps; with ``resumable`` (a cluster: the arrival at
        ``until`` may go to another replica) it is paused: the next call goes on with it at no cost
        per sequence. Anything that reaches the engine (a step, a request added or ended) first
        brings them up to date (:meth:`settle_span`; call it before reading them from outside),
        except the arrival's step of a scheduler that takes arrivals in bulk, which runs beside the lag."""
        span, self._span = self._span, None  # kept: a span that stopped for an arrival may go on
        plan = self._quiet_plan  # kept: a span cut short by an arrival elsewhere may go on (a cluster)
        if (span is None and plan is None) or not self._can_fast_forward():
            if span is not None:
                span.settle()
            return 0
        if span is not None:
            steps, self._span = resume(self, span, until, on_step_start, stop_after_end, resumable)
            if self._span is not span:
                span.settle()  # dropped: its sequences up to date
        else:
            assert plan is not None
            steps, self._span = fast_forward(self, plan, until, on_step_start, stop_after_end, resumable)
        self.num_fast_forwarded += steps
        return steps

    def settle_span(self) -> None:
        """Give the running sequences the tokens of a kept span's steps (:meth:`fast_forward`):
        they are then as the step-by-step path leaves them. The span is kept (an arrival's step may
        still take its decodes in bulk, :meth:`step`)."""
        if self._span is not None:
            self._span.settle()

    def _drop_span(self) -> None:
        """Something other than an arrival reached the engine: the kept span, up to date, ends."""
        span, self._span = self._span, None
        if span is not None:
            span.settle()

    def _can_fast_forward(self) -> bool:
        token = self.executor.placeholder_token
        return (token is not None and token not in self.eos_token_ids and getattr(self.clock, "kind", None) == "virtual"
                and self.limits.num_scheduler_steps == 1
                and self.drafter is None and self.connector is None and not self.keep_steps
                and type(self.allocator).quiet_decode_tokens is not BlockAllocator.quiet_decode_tokens
                and not any(getattr(f, "reads_step_details", True) for f in self.step_listeners))

    # ---- the step phases: step() composes them, and so do multi_step and fast_forward ------
    def schedule(self, now: float) -> SchedulePlan:
        """Decide the step: take the connector's finished transfers (:meth:`poll_connector`), then
        ask the scheduler for its plan at ``now`` (engine seconds). The scheduler allocates the
        plan's blocks and preempts; nothing else is asked. A plan that preempted and moved nothing
        is kept as the one a fast-forward span may follow (:meth:`fast_forward`)."""
        self._drop_span()
        if self.connector is not None:
            self.poll_connector()
        plan = self.call_plugin("scheduler", lambda: self.scheduler.schedule(now))
        if not plan.is_empty:
            self._quiet_plan = plan if self.fast_forward_enabled and may_precede_span(plan) else None
        return plan

    def count_waiting(self, num_scheduled: int) -> None:
        """After ``schedule``: the step being run runs ``num_scheduled`` sequences; the others the
        scheduler holds count as waiting in the timeline's row for it, when one is kept."""
        if self.timeline is not None and self.timeline.due == 1:  # this step's row will be kept
            self._waiting = self.scheduler.num_unfinished() - num_scheduled

    def execute(self, plan: SchedulePlan, work: StepWork) -> StepOutput:
        """Compute the step (``work`` is ``step_work(plan)``): the connector's worker side first
        moves in the loads the forward pass reads; then an executor without tensors gets the
        features alone, any other the batch, with the block tables read here (the executor never
        asks the allocator). Changes no sequence: :meth:`apply` does that with the output."""
        connector = self.connector
        if connector is not None:
            connector.start_load_kv()
            connector.wait_for_load()
        if not self.executor.needs_batch:
            return self.executor.execute_work(work)
        block_table = self.allocator.block_table
        tables = [block_table(e.seq.id) for e in plan.scheduled]
        return self.executor.execute(build_batch(plan, tables, self.limits.block_size, self.seed))

    def price(self, work: StepWork) -> float:
        """End the step computing ``work`` on the clock and return when it ended (engine seconds):
        a virtual clock advances by its time model's price of ``work``, then by what the connector's
        KV loads added to it (:func:`~servelab.engine.clock.price_kv_transfer`, the same for every
        connector and clock); a wall clock has run."""
        clock, connector = self.clock, self.connector
        if connector is None:
            clock.end_step(work)
            return self.now()
        start = clock.now()
        clock.end_step(work)
        transfer = connector.get_step_transfer_time()
        if transfer.load_s:
            added, hidden = price_kv_transfer(clock, clock.now() - start, transfer)
            connector.transfer_priced(added, hidden)
        return self.now()

    def deliver(self, at: float, num_tokens: int) -> float:
        """When the client gets ``num_tokens`` tokens computed at ``at``: then, or when the front end
        (``frontend=...``, :mod:`servelab.engine.frontend`) delivers them, as one output batch."""
        return at if self.frontend is None else self.frontend.deliver(at, num_tokens)

    def apply(self, plan: SchedulePlan, output: StepOutput, now: float, *, stamp: float | None = None,
              ended: list[tuple[Sequence, str]] | None = None,
              quiet: Iterable[tuple[Sequence, list[float]]] = ()) -> list[Sequence]:
        """Write what a step computed into its sequences, in this order:

        - ``quiet`` (a fast-forward span bringing sequences up to date,
          :mod:`servelab.engine.fast_forward`): each ``(seq, stamps)`` ran ``len(stamps)`` quiet
          decode steps, each giving it the executor's placeholder token, stamped as listed; the
          allocator settles their slots in bulk (``settle_quiet_decodes``); none of them ends it;
        - each entry of ``plan``, in plan order: its tokens count as computed and the allocator
          hears of it (``on_tokens_computed``); an entry that reached its sequence's last token
          appends the token ``output`` sampled for it (a verify entry: its accepted drafts and the
          target's token; the slots of the rest are released), stamped ``stamp`` (when the client
          gets it, :meth:`deliver`; default ``now``); a sequence that is done (a stop token, its
          length) is finished at ``now`` (:meth:`finish`), or, with ``ended`` (a multi-step window:
          plain decodes only), put there with its reason for the caller to finish;
        - then, without ``ended``, the connector starts sending the blocks of the sequences it kept.

        This is the one writer of ``seq.num_computed_tokens`` besides the allocator (KV that
        appears or goes without being computed here: ``BlockAllocator.start_sequence`` and its two
        siblings). Returns, when a drafter runs, the sequences that got tokens and still run (the
        next step drafts for them); else an empty list."""
        if quiet:
            token, settle = self.executor.placeholder_token, self.allocator.settle_quiet_decodes
            assert token is not None  # a span runs only on an executor with placeholder tokens
            for seq, stamps in quiet:
                seq.num_computed_tokens += len(stamps)
                seq.append_repeated(token, stamps)
                settle(seq, len(stamps))
        stamp = now if stamp is None else stamp
        tokens = iter(output.sampled)
        counts = iter(output.accepted) if output.accepted is not None else None
        on_tokens_computed = self.allocator.on_tokens_computed
        drafting = self.drafter is not None
        eos, max_len = self.eos_token_ids, self.limits.max_model_len
        grew: list[Sequence] = []
        for entry in plan.scheduled:
            seq = entry.seq
            if entry.draft_token_ids:
                assert counts is not None  # a step that verified drafts reports what it accepted
                num_accepted = self._count_verified(entry, next(counts))
                seq.num_computed_tokens = entry.start + 1 + num_accepted  # the last token + accepted drafts
                self._keep_verified(seq, [next(tokens) for _ in range(num_accepted + 1)], now, stamp)
                if seq.status is Status.RUNNING:
                    grew.append(seq)
                continue
            seq.num_computed_tokens += entry.num_tokens
            on_tokens_computed(seq)
            if seq.num_computed_tokens < seq.num_tokens:
                continue  # a prompt chunk: nothing sampled yet
            if counts is not None:
                next(counts)  # a plain decode in a verifying step: 0 drafts accepted
            token = next(tokens)
            seq.append_token(token, stamp)
            request = seq.request  # _finish_reason, inlined: once per sampled token
            if not request.ignore_eos and token in eos:
                reason: str | None = "stop"
            elif len(seq.output_token_ids) >= request.max_tokens or seq.num_tokens >= max_len:
                reason = "length"
            else:
                reason = None
            if reason and ended is not None:
                ended.append((seq, reason))
            elif reason:
                self.finish(seq, reason, now)
            elif drafting:
                grew.append(seq)
        if self.connector is not None and ended is None:
            self.connector.save_kv()  # sends of the sequences that just ended and were kept
        return grew

    def _count_verified(self, entry: ScheduledSeq, num_accepted: int) -> int:
        """A verify entry's acceptance, counted on its sequence and told to the drafter; returns it."""
        seq, drafts = entry.seq, entry.draft_token_ids
        seq.num_draft_tokens += len(drafts)
        seq.num_accepted_tokens += num_accepted
        seq.num_verify_steps += 1
        drafted, kept = seq.drafted_by_position, seq.accepted_by_position
        if len(drafted) < len(drafts):
            drafted.extend([0] * (len(drafts) - len(drafted)))
            kept.extend([0] * (len(drafts) - len(kept)))
        for i in range(len(drafts)):
            drafted[i] += 1
            kept[i] += i < num_accepted
        if self.drafter is not None:
            self.drafter.on_verified(seq, len(drafts), num_accepted)
        return num_accepted

    def _keep_verified(self, seq: Sequence, new: list[int], now: float, stamp: float) -> None:
        """After a verify entry (``seq.num_computed_tokens`` counts the kept tokens): release the
        slots of rejected drafts (their KV is never read: released, or overwritten later), append
        the accepted drafts and the target's token, finish at the first that ends ``seq``."""
        self.allocator.release_slots(seq, seq.num_computed_tokens)
        for token in new:
            seq.append_token(token, stamp)
            reason = self._finish_reason(seq, token)
            if reason:
                self.finish(seq, reason, now)
                return
        self.allocator.on_tokens_computed(seq)  # hashes cover verified tokens only

    def finish(self, seq: Sequence, reason: str, now: float) -> None:
        """End ``seq`` (it ran; ``reason``: ``"stop"`` or ``"length"``) at ``now``: the scheduler
        forgets it, its blocks are freed (or kept while the connector sends them), the drafter
        forgets it, the end listeners are told."""
        self.scheduler.remove(seq)
        self._retire(seq, reason, now)

    def draft(self, seqs: list[Sequence], now: float) -> float:
        """With a drafter, after :meth:`apply`: propose the next step's drafts for ``seqs`` (those
        that got tokens and still run), keep what is valid, and price drafting on the clock (a
        virtual clock advances by the time model's price). Returns when the step ended: ``now``
        when nothing was drafted."""
        if self.drafter is None or not seqs:
            return now
        work = self.call_plugin("drafter", lambda: self._propose(seqs))
        self.clock.end_draft(work)
        return self.now()

    def record(self, plan: SchedulePlan | None, work: StepWork, start: float, end: float,
               output: StepOutput | None = None, draft_s: float = 0.0) -> StepRecord | None:
        """Count a step that ran from ``start`` to ``end`` (engine seconds; ``draft_s`` of it
        drafting): the policies' cost model observes it, the totals take it, the step listeners
        get its record, which is kept while ``keep_steps`` and returned. ``plan`` None: a quiet
        decode step of a fast-forward span (it preempted and moved nothing); when nobody reads
        records only the sums are kept (what the record would add, bit for bit) and None is
        returned, and it leaves :attr:`last_step_s` (the last planned step's duration) alone."""
        # drafts are computed like prompt tokens: the policies' cost model sees them as such
        self.cost_model.observe_counts(work.prefill_tokens + work.draft_tokens, work.decode_seqs, work.attended, end - start)
        allocator, listeners, timeline = self.allocator, self.step_listeners, self.timeline
        waiting = self._waiting
        if plan is None:
            waiting = 0  # every sequence the scheduler holds runs in a span
            if not listeners and not self.keep_steps:
                kv_used = allocator.num_used_blocks() / max(1, allocator.num_blocks)
                self.totals.add_decode_step(end, end - start, work.num_seqs, kv_used, allocator.usage_stats())
                if timeline is not None:
                    timeline.due -= 1
                    if not timeline.due:
                        timeline.add(end, end - start, work.num_seqs, 0, work.num_tokens, 0, kv_used)
                return None
            plan = SchedulePlan()  # the record's lists are its own
        else:
            self.last_step_s = end - start
        # with no reader (a long simulated run keeps only totals) the per-entry fields are skipped;
        # a listener marked ``reads_step_details = False`` (the W&B logger's) does not need them
        detailed = self.keep_steps or any(getattr(f, "reads_step_details", True) for f in listeners)
        accepted = output.accepted if output is not None else None  # a step that verified drafts: its counts
        record = StepRecord(
            step=self.totals.num_steps, time_s=end, duration_s=end - start,
            model_s=output.model_s if output is not None else 0.0,
            num_seqs=work.num_seqs, num_tokens=work.num_tokens, prefill_tokens=work.prefill_tokens,
            decode_seqs=work.decode_seqs, kv_utilization=allocator.num_used_blocks() / max(1, allocator.num_blocks),
            queues=self.scheduler.queue_lengths() if detailed else {},
            comm_s=output.comm_s if output is not None else 0.0, preempted=plan.preempted,
            extra=allocator.usage_stats(), swap_out_blocks=len(plan.swap_out), swap_in_blocks=len(plan.swap_in),
            scheduled=[(e.seq.id, e.num_tokens) for e in plan.scheduled] if detailed else [],
            scheduler=self.scheduler.step_stats() if detailed else {}, work=work, draft_s=draft_s,
            draft_tokens=sum(len(e.draft_token_ids) for e in plan.scheduled) if accepted is not None else 0,
            accepted_tokens=sum(accepted) if accepted is not None else 0,
        )
        self.totals.add(record)
        if timeline is not None:
            if plan.preempted:
                timeline.preempted(len(plan.preempted))
            timeline.due -= 1
            if not timeline.due:
                timeline.add(end, end - start, work.num_seqs, waiting, work.num_tokens, work.prefill_tokens,
                             record.kv_utilization)
        if self.keep_steps:
            self.steps.append(record)
        for listener in listeners:
            listener(record)
        return record

    def _retire(self, seq: Sequence, reason: str, now: float) -> None:
        """``seq`` has left the scheduler: end it (``reason``), free its blocks, drop drafter state,
        tell the listeners."""
        seq.finish(reason, now)
        connector = self.connector
        if connector is not None and connector.request_finished(seq, self.allocator.block_table(seq.id)):
            self._sending[seq.id] = seq  # the connector still reads its blocks: freed once it says sent
        else:
            self.allocator.free(seq)
        seq.compact()  # its token times as one array: the writer's ITLs and the fairness log read them without a copy
        if self.drafter is not None:
            self.drafter.forget(seq)
        self._ended(seq)

    def _propose(self, seqs: list[Sequence]) -> DraftWork:
        """Ask the drafter for the next step's drafts of ``seqs``; keep what is valid; say what
        drafting did (for the clock)."""
        assert self.drafter is not None  # called only when a drafter runs
        k = self.drafter.num_speculative_tokens
        proposal = self.drafter.propose(seqs, k)
        drafts = proposal if isinstance(proposal, Drafts) else Drafts(list(proposal))
        if len(drafts.token_ids) != len(seqs):
            raise ValueError(f"propose() returned {len(drafts.token_ids)} proposals for {len(seqs)} sequences")
        vocab, max_len = self.executor.spec.vocab_size, self.limits.max_model_len
        for i, (seq, ids) in enumerate(zip(seqs, drafts.token_ids)):
            # Room left: never draft past max_tokens or max_model_len (the target's token comes on top).
            room = min(k, seq.request.max_tokens - seq.num_output_tokens - 1, max_len - seq.num_tokens - 1)
            ids = list(ids[:max(room, 0)]) if len(ids) > room else list(ids)
            if len(drafts.token_ids[i]) > k:
                self._warn_drafter(f"proposed {len(drafts.token_ids[i])} drafts for {seq.id!r}, more than "
                                   f"drafter.k={k}; truncated")
            bad = next((j for j, t in enumerate(ids) if not (isinstance(t, int) and 0 <= t < vocab)), None)
            if bad is not None:
                self._warn_drafter(f"proposed token id {ids[bad]!r} for {seq.id!r}, outside the vocabulary "
                                   f"[0, {vocab}); its drafts were cut there")
                ids = ids[:bad]
            seq.draft_token_ids = ids
            seq.draft_probs = drafts.probs[i] if drafts.probs is not None and ids else None
        lengths = [len(seq.draft_token_ids) for seq in seqs]
        return DraftWork(num_seqs=sum(1 for n in lengths if n), draft_tokens=sum(lengths),
                         num_passes=max(lengths, default=0), context_tokens=sum(seq.num_tokens for seq in seqs),
                         runs_model=self._drafter_runs_model)

    def _warn_drafter(self, message: str) -> None:
        """One warning per kind of fault, naming the drafter (a drafter bug must not flood the log)."""
        kind = message.split(" ", 1)[0] + message.rsplit(";", 1)[-1]
        if kind not in self._drafter_warned:
            self._drafter_warned.add(kind)
            assert self.drafter is not None  # called only when a drafter runs
            log.warning("drafter %r %s", type(self.drafter).name, message)

    def _ended(self, seq: Sequence) -> None:
        self.num_ended += 1
        for listener in self.end_listeners:
            listener(seq)
        if self.forget_ended:
            del self.sequences[seq.id]
            self._forgotten.add(seq.id)

    def _finish_reason(self, seq: Sequence, token: int) -> str | None:
        request = seq.request
        if not request.ignore_eos and token in self.eos_token_ids:
            return "stop"
        if len(seq.output_token_ids) >= request.max_tokens or seq.num_tokens >= self.limits.max_model_len:
            return "length"
        return None

    def call_plugin(self, role: str, fn: Callable[[], _T]) -> _T:
        """``fn()``, a call into the ``role`` plugin (an attribute of the engine: ``"scheduler"``);
        a failure is re-raised as :class:`PluginFailure` naming the plugin and the step."""
        try:
            return fn()
        except (LengthPredictorError, EvictorError) as exc:  # already names its plugin and the request/block
            raise PluginFailure(f"{exc} (step {self.totals.num_steps})") from exc
        except Exception as exc:  # name the plugin and step in the error
            plugin = getattr(self, role)
            raise PluginFailure(f"{role} plugin {type(plugin).name!r} failed at step {self.totals.num_steps}: "
                                f"{type(exc).__name__}: {exc}") from exc
