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

A *resumable* span (a cluster's replica: the arrival at ``until`` may be routed elsewhere) that
stopped only at ``until`` is paused instead of ended: its sequences keep their lag, and the next
``Engine.fast_forward`` goes on with it (:meth:`Span.go_on`), so an arrival costs a replica it
does not reach nothing per sequence. Anything that reaches the engine first brings the sequences
up to date (``Engine.settle_span``). Only the slot counts and token lists lag; the scheduler's
queues and the allocator's blocks, which a router's gauges read, are exact at every span step.
"""

from __future__ import annotations

import heapq
from typing import TYPE_CHECKING, Callable, Iterable

from servelab.core.executor import StepOutput
from servelab.core.interfaces import NextDecision, ScheduledSeq, SchedulePlan
from servelab.core.request import Sequence, Status
from servelab.core.step_work import StepWork

if TYPE_CHECKING:
    from servelab.engine.engine import Engine

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


def fast_forward(engine: Engine, plan: SchedulePlan, until: float,
                 on_step_start: Callable[[], None] | None = None, stop_after_end: bool = False,
                 resumable: bool = False) -> tuple[int, Span | None]:
    """Run the quiet steps that may follow ``plan`` (the step just taken, decodes only) and come
    before ``until`` (with ``stop_after_end``: up to the first step in which a sequence finished);
    returns how many were run (0: none could be) and, with ``resumable``, the span when it stopped
    only because its next step starts at or after ``until``: its sequences are not yet brought up to
    date (:meth:`Span.go_on` goes on from there, :meth:`Span.settle` brings them up to date)."""
    seqs = [e.seq for e in plan.scheduled if e.seq.status is Status.RUNNING]
    if not seqs or len(seqs) != engine.scheduler.num_unfinished():
        return 0, None  # someone waits (or is swapped, or loading): the scheduler decides every step
    for seq in seqs:
        if seq.num_tokens - seq.num_computed_tokens != 1 or seq.num_computed_tokens < seq.request.prompt_len:
            return 0, None  # a prompt chunk is still to come
    now = engine.now()
    if not resumable and now + MIN_SPAN_STEPS * engine.last_step_s >= until:
        return 0, None  # no room for a span worth its set-up (a resumable one may outlast ``until``)
    steps, at_s = next_decision(engine, now)
    if steps == 0 or now >= min(until, at_s):
        return 0, None
    span = Span(engine, seqs, steps, at_s)
    ran = span.go_on(until, on_step_start, stop_after_end, resumable)
    return ran, span if span.paused else None


class Span:
    """The sequences of one span (in plan order), how far each has been brought up to date, and
    what the scheduler declared (``max_steps`` steps, none starting at or after ``at_s``)."""

    def __init__(self, engine: Engine, seqs: list[Sequence], max_steps: int, at_s: float) -> None:
        self.engine = engine
        self.seqs = seqs
        self.max_steps = max_steps
        self.at_s = at_s
        self.step = 0  # span steps run so far
        self.active = len(seqs)  # sequences still running
        self.context = sum(seq.num_tokens for seq in seqs)  # each decode attends to its whole context
        #: stopped only at ``until`` with its sequences not brought up to date (go_on may go on)
        self.paused = False
        token = engine.executor.placeholder_token
        assert token is not None  # Engine._can_fast_forward checked
        self.token: int = token
        self.synced = [0] * len(seqs)  # span steps whose tokens seqs[i] has been given
        self.ends: list[float] = []  # each span step's tokens' timestamps (its end, or when a front end delivers them)
        quiet, max_len = engine.allocator.quiet_decode_tokens, engine.limits.max_model_len
        events = []  # (span step, plan index): each sequence's next event, as _next_event says
        for i, seq in enumerate(seqs):  # once per span per sequence: _next_event inlined
            left = min(seq.request.max_tokens - len(seq.output_token_ids), max_len - seq.num_tokens)
            q = quiet(seq)
            events.append((q if q < left else left - 1, i))
        heapq.heapify(events)
        self.events = events

    def _next_event(self, seq: Sequence, step: int) -> int:
        """The first span step from ``step`` on that is not quiet for ``seq`` (it is up to date):
        the allocator must act, or its ``left``-th token ends it."""
        quiet = self.engine.allocator.quiet_decode_tokens(seq)
        left = min(seq.request.max_tokens - len(seq.output_token_ids), self.engine.limits.max_model_len - seq.num_tokens)
        return step + (quiet if quiet < left else left - 1)

    def _lag(self, indices: Iterable[int], step: int) -> list[tuple[Sequence, list[float]]]:
        """What ``seqs[i]`` (each of ``indices``) has not been given of the quiet span steps before
        ``step``, as :meth:`Engine.apply`'s ``quiet`` pairs (the sequence, those steps' stamps);
        from here on they count as given."""
        seqs, synced, ends = self.seqs, self.synced, self.ends
        lag = []
        for i in indices:
            done = synced[i]
            if step > done:
                lag.append((seqs[i], ends[done:step]))
                synced[i] = step
        return lag

    def go_on(self, until: float, on_step_start: Callable[[], None] | None, stop_after_end: bool = False,
              resumable: bool = False) -> int:
        """Run span steps, none starting at or after ``until`` or the declared ``at_s``, up to the
        declared ``max_steps``, through the engine's step phases (``price``, ``apply``, ``record``);
        returns how many ran. It then brings every sequence up to date (:meth:`settle`), unless
        ``resumable`` and it stopped only at ``until``: it is then ``paused``, and a later call
        (nothing having reached the engine since) goes on from there."""
        engine, seqs, events, ends, synced = self.engine, self.seqs, self.events, self.ends, self.synced
        allocator, token = engine.allocator, self.token
        count_quiet, apply, price, record = allocator.count_quiet_decodes, engine.apply, engine.price, engine.record
        no_plan, no_output = SchedulePlan(), StepOutput([], 0.0)  # a quiet step preempts and moves nothing
        events_plan, events_output = SchedulePlan(), StepOutput([], 0.0)  # refilled each step (apply keeps neither)
        active, context, step, max_steps, at_s = self.active, self.context, self.step, self.max_steps, self.at_s
        limit = min(until, at_s)
        first = step
        paused = False
        while step < max_steps and active:
            start = engine.now()
            if start >= limit:
                paused = resumable and start < at_s
                break
            due: list[int] = []
            while events and events[0][0] == step:
                due.append(heapq.heappop(events)[1])
            if due and len(due) > allocator.num_free_blocks():  # each may need a block: the scheduler decides
                for i in due:
                    heapq.heappush(events, (step, i))
                break
            if on_step_start is not None:
                on_step_start()
            if due:  # their allocations, in plan order, as schedule() makes them, once they are up to date
                lag = self._lag(due, step)
                if lag:
                    apply(no_plan, no_output, start, quiet=lag)
                for i in due:
                    if not allocator.allocate_slots(seqs[i], 1):
                        raise RuntimeError(f"allocator plugin {type(allocator).name!r} refused one decode slot for "
                                           f"{seqs[i].id!r} with {allocator.num_free_blocks()} free blocks: its "
                                           "quiet_decode_tokens() contract says such a step takes at most one block")
            n = active
            if n > len(due):
                count_quiet(n - len(due))
            work = StepWork(n, n, 0, n, n, context, context)
            end = price(work)
            stamp = engine.deliver(end, n)  # when the client gets the step's tokens
            ends.append(stamp)
            left_tokens = 0
            if due:  # their tokens and finishes, in plan order
                events_plan.scheduled = [ScheduledSeq(seqs[i], 1, seqs[i].num_computed_tokens) for i in due]
                events_output.sampled = [token] * len(due)
                apply(events_plan, events_output, end, stamp=stamp)
                for i in due:
                    seq = seqs[i]
                    synced[i] = step + 1
                    if seq.status is Status.RUNNING:
                        heapq.heappush(events, (self._next_event(seq, step + 1), i))
                    else:
                        active -= 1
                        left_tokens += seq.num_tokens
            context += n - left_tokens
            record(None, work, start, end)
            step += 1
            if stop_after_end and left_tokens:
                break
        self.active, self.context, self.step, self.paused = active, context, step, paused
        if not paused:
            self.settle()
        return step - first

    def settle(self) -> None:
        """Bring every running sequence up to date with the span steps run so far."""
        self.paused = False
        lag = self._lag((i for i, seq in enumerate(self.seqs) if seq.status is Status.RUNNING), self.step)
        if lag:
            self.engine.apply(SchedulePlan(), StepOutput([], 0.0), self.engine.now(), quiet=lag)
