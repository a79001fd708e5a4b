"""Fast-forward (``sim.fast_forward``): a span of quiet decode steps run without asking the
policies at every step, leaving exactly the state, step totals and results the step-by-step
path leaves.

A span may start after a step that verified no drafts and preempted nothing, once every sequence
the scheduler holds is running and has exactly one token to compute (it decodes next), on an engine whose executor answers with placeholder tokens (the simulator) on a virtual clock,
with no drafter, no KV connector and nobody reading per-step details. Then:

- the scheduler says for how many steps (or until when) it need not be asked
  (:meth:`~servelab.core.interfaces.Scheduler.next_decision`);
- the allocator says, per sequence, how many of its coming decode steps are quiet
  (:meth:`~servelab.core.interfaces.BlockAllocator.quiet_decode_tokens`);
- a sequence's next *event* is the first span step that is not quiet for it: the allocator must
  act (a new block, a full block to hash) or the sequence finishes there.

A span drives the engine's step phases as :meth:`Engine.step` does, without ``schedule`` and
``execute``: each span step is priced (``Engine.price``: the clock's time model, from the step's
features, which change only by the context growing and finished sequences leaving) and recorded
(``Engine.record``: totals, the policies' cost model, step listeners), and handles only that step's
events, in plan order: their allocations before the step, as ``schedule()`` makes them, then their
tokens and finishes after it, through ``Engine.apply``. Every other sequence gets its tokens in bulk,
through the same apply (its ``quiet`` pairs), when it next has an event or the span ends (the
allocator is told the counts).

A span stops before a step that would start at or after ``until`` (the next arrival: the driver
adds it before that step), when the scheduler's declared steps or time run out, before a step
whose allocations could outnumber the free blocks (the step-by-step path then preempts), or
when no sequence is left; with ``stop_after_end`` (closed-loop arrivals, which become known only
when a request ends), also after a step in which a sequence finished.

A span that stopped only at ``until`` is kept, its sequences not brought up to date. A
*resumable* one (a cluster's replica: the arrival at ``until`` may be routed elsewhere) is paused:
the next ``Engine.fast_forward`` goes on with it within the scheduler's first answer (:func:`resume`),
so an arrival costs a replica it does not reach nothing per sequence. When the arrival reaches the
engine and the scheduler takes arrivals in bulk (:func:`takes_arrivals_in_bulk`: it promises that
``add``, ``next_decision`` and ``schedule_arrivals`` read no running sequence's tokens), the
arrival's step runs beside the lag (:func:`arrival_step`) and the span goes on: a sequence is
brought up to date only at its own events, whatever the arrivals. Anything else that reaches the
engine first brings the sequences up to date (``Engine.settle_span``: a step, a sequence added or
ended, a request added for any other scheduler). Only the slot counts and token lists lag; the
scheduler's queues and the allocator's blocks, which a router's gauges read, are exact at every
span step.
"""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING, Callable, Iterable, TypeGuard

from servelab.core.executor import StepOutput
from servelab.core.interfaces import NextDecision, ScheduledSeq, SchedulePlan
from servelab.core.request import Sequence, Status
from servelab.core.step_work import StepWork
from servelab.engine.batch import step_work
from servelab.engine.scheduling import QueueScheduler

if TYPE_CHECKING:
    from servelab.engine.engine import Engine, StepRecord

INF = float("inf")
#: A span is tried only when about this many steps (each as long as the last) fit before the next
#: arrival: a shorter one costs more (passes over every sequence) than the steps it skips. Declining
#: never changes a result; on the 8-replica trace case, when every arrival ended every replica's
#: span, 1 measured best: 37 s against 48 s with 3 and 49 s step by step. A resumable span is
#: always tried: an arrival elsewhere only pauses it.
MIN_SPAN_STEPS = 1


def may_precede_span(plan: SchedulePlan) -> bool:
    """Whether a span may follow ``plan``: it preempted and moved nothing (it verified no drafts
    either: no span runs with a drafter; whether its sequences all decode next is checked after it ran)."""
    return not plan.preempted and not plan.swap_out and not plan.swap_in and not plan.copy_blocks


def next_decision(engine: Engine, now: float) -> NextDecision:
    """The scheduler's answer, checked (a malformed one names the plugin)."""
    scheduler = engine.scheduler
    answer = engine.call_plugin("scheduler", lambda: scheduler.next_decision(now))
    steps, at_s = answer if isinstance(answer, tuple) and len(answer) == 2 else (None, None)
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 0 or not isinstance(at_s, (int, float)):
        raise TypeError(f"scheduler plugin {type(scheduler).name!r}: next_decision() returned {answer!r}; "
                        "expected NextDecision(steps >= 0, at_s)")
    return NextDecision(steps, float(at_s))


def fast_forward(engine: Engine, plan: SchedulePlan, until: float, on_step_start: Callable[[], None] | None = None,
                 stop_after_end: bool = False, resumable: bool = False) -> tuple[int, Span | None]:
    """Run the quiet steps that may follow ``plan`` (the step just taken, decodes only) and come
    before ``until`` (with ``stop_after_end``: up to the first step in which a sequence finished);
    returns how many were run (0: none could be) and the span to keep, or None. A span that stops
    for the arrival at ``until`` (or is too short to run before it) is kept (the engine holds it):
    the arrival's step may take its decodes in bulk (:func:`arrival_step`), and it goes on after;
    its sequences are then not yet brought up to date (:meth:`Span.settle`); with ``resumable`` it
    is kept paused."""
    seqs = [e.seq for e in plan.scheduled if e.seq.status is Status.RUNNING]
    if not seqs or len(seqs) != engine.scheduler.num_unfinished():
        return 0, None  # someone waits (or is swapped, or loading): the scheduler decides every step
    for seq in seqs:
        if seq.num_tokens - seq.num_computed_tokens != 1 or seq.num_computed_tokens < seq.request.prompt_len:
            return 0, None  # a prompt chunk is still to come
    if (not resumable and engine.now() + MIN_SPAN_STEPS * engine.last_step_s >= until
            and not takes_arrivals_in_bulk(engine.scheduler)):
        return 0, None  # no room for a span worth its set-up, nor an arrival's step to take in bulk
    return _go_on(engine, Span(engine, seqs), until, on_step_start, stop_after_end, resumable)


def resume(engine: Engine, span: Span, until: float, on_step_start: Callable[[], None] | None = None,
           stop_after_end: bool = False, resumable: bool = False) -> tuple[int, Span | None]:
    """Go on with ``span``, the engine's kept span: after the step that took an arrival
    (:func:`arrival_step`), or after an arrival that went elsewhere (a cluster). Declines, keeping
    it, while a sequence waits (the next step takes it). A paused span (nothing reached the engine
    since it paused) goes on within the scheduler's answer it ran under, without asking again: its
    sequences are not up to date. The caller settles a span it is not given back."""
    if span.paused:
        if span.steps_left <= 0:
            return 0, None
        ran = span.run(span.steps_left, until, on_step_start, stop_after_end, resumable)
        return ran, span if span.open else None
    if span.active != engine.scheduler.num_unfinished():
        return 0, span
    return _go_on(engine, span, until, on_step_start, stop_after_end, resumable)


def takes_arrivals_in_bulk(scheduler: object) -> TypeGuard[QueueScheduler]:
    """Whether ``scheduler`` declares that an arrival's step may take the running decodes in bulk."""
    return isinstance(scheduler, QueueScheduler) and scheduler.arrivals_beside_decodes()


def _go_on(engine: Engine, span: Span, until: float, on_step_start: Callable[[], None] | None,
           stop_after_end: bool, resumable: bool) -> tuple[int, Span | None]:
    """The scheduler's horizon, then ``span.run`` up to it and ``until``; the span is kept while
    it may take the next arrival's step (the scheduler's horizon has not run out). A resumable
    span is always run: an arrival elsewhere only pauses it."""
    now = engine.now()
    # no room for a span worth its set-up (a resumable one is run: an arrival elsewhere only pauses it)
    short = not resumable and now + MIN_SPAN_STEPS * engine.last_step_s >= until
    if short and not takes_arrivals_in_bulk(engine.scheduler):
        return 0, None
    steps, at_s = next_decision(engine, now)
    if steps == 0 or now >= at_s:
        return 0, None
    span.at_s = at_s
    if short:  # (an arrival is due now, or soon) the arrival's step may still take these decodes in bulk
        span.open = True
        return 0, span
    ran = span.run(steps, until, on_step_start, stop_after_end, resumable)
    return ran, span if span.open else None


def arrival_step(engine: Engine, span: Span, start: float) -> tuple[StepRecord | None, Span | None]:
    """The step after ``span`` stopped for an arrival, with the span's decodes taken in bulk, or
    None (nothing changed) when it cannot be: the scheduler (a :class:`QueueScheduler`) declares
    :meth:`~servelab.engine.scheduling.QueueScheduler.arrivals_beside_decodes` and is in a state
    where :meth:`schedule` would start by giving every running sequence (the span's, in the
    span's order) one decode token; the allocator has a block for each of them that needs one.

    As :meth:`Engine.step` runs it: the due sequences' allocations (in plan order), then
    :meth:`~servelab.engine.scheduling.QueueScheduler.schedule_arrivals` (admissions, with the
    decodes' budget and context), the step's work (the decodes' counts plus the admissions'
    entries), ``execute``, ``price``, one ``apply`` (every other span sequence brought up to date
    through its ``quiet`` pairs, then the due entries and the admissions, in plan order), and
    ``record`` with the admissions' plan. Admitted sequences that decode next join the span. The
    other span sequences are not brought up to date (the scheduler reads only the counts), except
    those with an event at the coming step: the span goes on lagging as it came."""
    scheduler = engine.scheduler
    n = span.active
    assert not span.paused  # the engine settles it first (a request added did)
    if (not span.open or start >= span.at_s or not takes_arrivals_in_bulk(scheduler)
            or not scheduler.may_take_decodes_in_bulk(n)):
        return None, None
    events, seqs, allocator = span.events, span.seqs, engine.allocator
    step = span.step
    due: list[int] = []
    while events and events[0][0] == step:
        due.append(heapq.heappop(events)[1])
    if due and len(due) > allocator.num_free_blocks():
        return None, None  # the scheduler may preempt: the step-by-step path decides (the span is dropped)
    for i in due:
        span.allocate(seqs[i])
    plan = engine.call_plugin("scheduler", lambda: scheduler.schedule_arrivals(start, n, span.context))
    if plan.preempted or plan.swap_out or plan.swap_in or plan.copy_blocks:
        raise RuntimeError(f"scheduler plugin {type(scheduler).name!r}: schedule_arrivals() preempted or moved "
                           "blocks; arrivals_beside_decodes() says it never does")
    engine.count_waiting(n + len(plan.scheduled))
    if n > len(due):
        allocator.count_quiet_decodes(n - len(due))
    added, context = step_work(plan), span.context
    work = StepWork(n + added.num_tokens, n + added.num_seqs, added.prefill_tokens, n + added.decode_seqs,
                    n + added.num_sampled, context + added.attended, context + added.context_tokens)
    output = engine.execute(plan, work)
    end = engine.price(work)
    stamp = engine.deliver(end, len(output.sampled))
    span.ends.append(stamp)
    span.step = step = step + 1
    upcoming = []  # sequences with an event at the coming step: up to date for its allocations
    while events and events[0][0] == step:
        upcoming.append(heapq.heappop(events)[1])
    lag = span.lag(upcoming, step)
    for i in upcoming:
        heapq.heappush(events, (step, i))
    entries = span.event_entries(due)
    engine.apply(SchedulePlan(entries + plan.scheduled), StepOutput([span.token] * len(due) + output.sampled[n:], 0.0),
                 end, stamp=stamp, quiet=lag)
    for i in span.after_events(due, n):  # due again at the coming step
        heapq.heappush(events, (step, i))
    record = engine.record(plan, work, start, end, output)
    span.open = False
    span.rebase()  # (when ended sequences pile up)
    for entry in plan.scheduled:
        seq = entry.seq
        if seq.status is not Status.RUNNING:
            continue  # ended at once
        if seq.num_tokens - seq.num_computed_tokens != 1 or seq.num_computed_tokens < seq.request.prompt_len:
            span.settle()
            return record, None  # a prompt chunk is still to come: the span ends, everyone up to date
        span.add(seq)
    return record, span


class Span:
    """The sequences of one span (in plan order) and how far each has been brought up to date.

    Span steps are counted from the span's start (``step``); ``synced[i]``: the span steps whose
    tokens ``seqs[i]`` has been given; ``ends[k]``: span step ``k``'s stamp. A sequence with an event
    at ``step`` is up to date; the others may lag while the engine keeps the span (:meth:`settle`
    brings them up to date; a span not kept is settled). ``open``: it stopped for an arrival
    (``until``) inside the scheduler's horizon (before ``at_s``), so that arrival's step may take
    its decodes in bulk. ``paused``: open, resumable (a cluster), and nothing reached the engine
    since: it may go on within the scheduler's answer it ran under (``steps_left`` of it)."""

    def __init__(self, engine: Engine, seqs: list[Sequence]) -> None:
        self.engine = engine
        self.seqs = seqs
        token = engine.executor.placeholder_token
        assert token is not None  # Engine._can_fast_forward checked
        self.token: int = token
        self.synced = [0] * len(seqs)  # span steps whose tokens seqs[i] has been given
        self.ends: list[float] = []  # each span step's tokens' timestamps (its end, or when a front end delivers them)
        self.entries: list[ScheduledSeq | None] = [None] * len(seqs)  # each sequence's event entry, made once, reused
        self.step = 0
        self.active = len(seqs)
        self.context = sum(seq.num_tokens for seq in seqs)  # each decode attends to its whole context
        self.open = False
        self.paused = False
        self.at_s = INF
        self.steps_left = 0
        # what run() hands apply(), made once (a cluster's replica runs a step or two per call):
        # a quiet step's empty plan and output, and the plan and output refilled with each step's events
        self._plans = SchedulePlan(), StepOutput([], 0.0), SchedulePlan(), StepOutput([], 0.0)
        quiet, max_len = engine.allocator.quiet_decode_tokens, engine.limits.max_model_len
        events = []  # (span step, plan index): each sequence's next event, as _next_event says
        for i, seq in enumerate(seqs):  # once per span per sequence: _next_event inlined
            left = min(seq.request.max_tokens - len(seq.output_token_ids), max_len - seq.num_tokens)
            q = quiet(seq)
            events.append((q if q < left else left - 1, i))
        heapq.heapify(events)
        self.events = events

    def add(self, seq: Sequence) -> None:
        """``seq`` (up to date, decoding next) joins the span, after every sequence in it."""
        i = len(self.seqs)
        self.seqs.append(seq)
        self.synced.append(self.step)
        self.entries.append(None)
        self.active += 1
        self.context += seq.num_tokens
        heapq.heappush(self.events, (self._next_event(seq, self.step), i))

    def rebase(self) -> None:
        """Once ended sequences outnumber the running ones, forget them and count span steps from
        the oldest one a running sequence lags behind (a span kept across arrivals stays about as
        long as its running batch, and its stamps as long as the longest lag)."""
        seqs, entries, synced = self.seqs, self.entries, self.synced
        if len(seqs) < 2 * self.active + 16:
            return  # a few ended ones cost less to skip than to drop (amortised: dropped in a batch)
        keep = [i for i, seq in enumerate(seqs) if seq.status is Status.RUNNING]
        base = min((synced[i] for i in keep), default=self.step)
        index = {old: new for new, old in enumerate(keep)}
        self.seqs = [seqs[i] for i in keep]
        self.entries = [entries[i] for i in keep]
        self.synced = [synced[i] - base for i in keep]
        del self.ends[:base]
        self.step -= base
        # both maps keep the order (a shift, an increasing renumbering): the heap stays a heap
        self.events = [(at - base, index[i]) for at, i in self.events]

    def _next_event(self, seq: Sequence, step: int) -> int:
        """The first span step from ``step`` on that is not quiet for ``seq`` (it is up to date):
        the allocator must act, or its ``left``-th token ends it."""
        quiet = self.engine.allocator.quiet_decode_tokens(seq)
        left = min(seq.request.max_tokens - len(seq.output_token_ids), self.engine.limits.max_model_len - seq.num_tokens)
        return step + (quiet if quiet < left else left - 1)

    def lag(self, indices: Iterable[int], step: int) -> list[tuple[Sequence, list[float]]]:
        """What ``seqs[i]`` (each of ``indices``) has not been given of the quiet span steps before
        ``step``, as :meth:`Engine.apply`'s ``quiet`` pairs (the sequence, those steps' stamps);
        from here on they count as given. Ended sequences are skipped."""
        seqs, synced, ends = self.seqs, self.synced, self.ends
        lag = []
        for i in indices:
            done = synced[i]
            if step > done and seqs[i].status is Status.RUNNING:
                lag.append((seqs[i], ends[done:step]))
                synced[i] = step
        return lag

    def allocate(self, seq: Sequence) -> None:
        """A due sequence's slot for the coming step, as ``schedule()`` allocates a decode."""
        allocator = self.engine.allocator
        if not allocator.allocate_slots(seq, 1):
            raise RuntimeError(f"allocator plugin {type(allocator).name!r} refused one decode slot for "
                               f"{seq.id!r} with {allocator.num_free_blocks()} free blocks: its "
                               "quiet_decode_tokens() contract says such a step takes at most one block")

    def event_entries(self, due: list[int]) -> list[ScheduledSeq]:
        """The plan entries of the due sequences (one decode token each), in plan order."""
        seqs, entries, out = self.seqs, self.entries, []
        for i in due:
            entry, seq = entries[i], seqs[i]
            if entry is None:
                entry = entries[i] = ScheduledSeq(seq, 1, seq.num_computed_tokens)
            else:
                entry.start = seq.num_computed_tokens
            out.append(entry)
        return out

    def after_events(self, due: list[int], n: int) -> list[int]:
        """After the step (``self.step`` counts it) whose ``n`` decodes applied ``due``'s entries:
        their next events are queued, the finished leave, the context grows. Returns, in plan
        order and not queued, those whose next event is at the coming step."""
        seqs, synced, events, step = self.seqs, self.synced, self.events, self.step
        again: list[int] = []
        left_tokens = 0
        for i in due:
            seq = seqs[i]
            synced[i] = step
            if seq.status is Status.RUNNING:
                at = self._next_event(seq, step)
                if at == step:
                    again.append(i)
                else:
                    heapq.heappush(events, (at, i))
            else:
                self.active -= 1
                left_tokens += seq.num_tokens
        self.context += n - left_tokens
        self.left_tokens = left_tokens
        return again

    def run(self, max_steps: int, until: float, on_step_start: Callable[[], None] | None,
            stop_after_end: bool = False, resumable: bool = False) -> int:
        """Run up to ``max_steps`` span steps, none starting at or after ``until`` or ``self.at_s``,
        through the engine's step phases (``price``, ``apply``, ``record``); returns how many ran.

        One ``apply`` per span step: it brings the sequences with an event at the *next* step up
        to date (their ``quiet`` pairs, this step's tokens included), then takes this step's event
        entries; so when a step starts, its due sequences are up to date for their allocations.
        Nothing reads a sequence between the two (a span runs no policy), so this is the order the
        step-by-step path leaves. On return every running sequence is up to date (:meth:`settle`),
        unless it stopped for the arrival at ``until`` (``open``) and is kept lagging: resumable (it
        is then ``paused``), or for a scheduler that takes that arrival's step beside the lag."""
        engine, seqs, events, ends, synced, entries = self.engine, self.seqs, self.events, self.ends, self.synced, self.entries
        allocator, token, next_event = engine.allocator, self.token, self._next_event
        count_quiet, apply, price, record = allocator.count_quiet_decodes, engine.apply, engine.price, engine.record
        deliver, allocate, now, heappop = engine.deliver, self.allocate, engine.now, heapq.heappop
        no_plan, no_output, events_plan, events_output = self._plans
        limit = min(until, self.at_s)
        self.open = False
        step, active, context = self.step, self.active, self.context  # locals in the loop, written back after it
        ran = left_tokens = 0
        due: list[int] = []  # the sequences with an event at ``step`` (up to date), in plan order
        while events and events[0][0] == step:
            due.append(heappop(events)[1])
        # on_step_start only where what it keeps may differ: at the first step, at a step with events
        # (its ends are told as of its start), and after one (a quiet step changes no queue, block or end)
        changed = True
        while ran < max_steps and active:
            start = now()
            if start >= limit:
                self.open = start < self.at_s  # stopped for the arrival at ``until``
                break
            if due and len(due) > allocator.num_free_blocks():  # each may need a block: the scheduler decides
                break
            if (changed or due) and on_step_start is not None:
                on_step_start()
            changed = bool(due)
            for i in due:  # their allocations, in plan order, as schedule() makes them
                allocate(seqs[i])
            n = active
            if n > len(due):
                count_quiet(n - len(due))
            work = StepWork(n, n, 0, n, n, context, context)
            end = price(work)
            stamp = deliver(end, n)  # when the client gets the step's tokens
            ends.append(stamp)
            step += 1
            ran += 1
            upcoming: list[int] = []  # events at the next step of sequences without one now
            lag = []  # ... brought up to date (this step's token included): self.lag, inlined
            while events and events[0][0] == step:
                i = heappop(events)[1]
                upcoming.append(i)
                lag.append((seqs[i], ends[synced[i]:step]))
                synced[i] = step
            left_tokens = 0
            if due:  # their tokens and finishes, in plan order (self.event_entries and self.after_events, inlined)
                scheduled = []
                for i in due:
                    entry, seq = entries[i], seqs[i]
                    if entry is None:
                        entry = entries[i] = ScheduledSeq(seq, 1, seq.num_computed_tokens)
                    else:
                        entry.start = seq.num_computed_tokens
                    scheduled.append(entry)
                events_plan.scheduled = scheduled
                events_output.sampled = [token] * len(due)
                apply(events_plan, events_output, end, stamp=stamp, quiet=lag)
                again = False
                for i in due:
                    seq = seqs[i]
                    synced[i] = step
                    if seq.status is Status.RUNNING:
                        at = next_event(seq, step)
                        if at == step:
                            upcoming.append(i)
                            again = True
                        else:
                            heapq.heappush(events, (at, i))
                    else:
                        active -= 1
                        left_tokens += seq.num_tokens
                if again:
                    upcoming.sort()
            elif lag:
                apply(no_plan, no_output, end, quiet=lag)
            context += n - left_tokens
            due = upcoming
            record(None, work, start, end)
            if stop_after_end and left_tokens:
                break
        self.step, self.active, self.context, self.left_tokens = step, active, context, left_tokens
        self.steps_left = max_steps - ran
        for i in due:  # popped, not run: their events stay (the span may go on)
            heapq.heappush(events, (step, i))
        self.paused = resumable and self.open
        if not (self.paused or (self.open and takes_arrivals_in_bulk(engine.scheduler))):
            self.settle()
        return ran

    def settle(self) -> None:
        """Bring every running sequence up to date with the span steps run so far (a no-op unless
        the engine kept the span lagging); a span kept open is then rebased."""
        self.paused = False
        lag = self.lag(range(len(self.seqs)), self.step)
        if lag:
            self.engine.apply(SchedulePlan(), StepOutput([], 0.0), self.engine.now(), quiet=lag)
        if self.open:
            self.rebase()
