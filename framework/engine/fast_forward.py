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
#: never changes a result; on the 8-replica trace case (every arrival ends every replica's span)
#: 1 measured best: 37 s against 48 s with 3 and 49 s step by step.
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
                 on_step_start: Callable[[], None] | None = None, stop_after_end: bool = False) -> int:
    """Run the quiet steps that may follow ``plan`` (the step just taken, decodes only) and come
    before ``until`` (with ``stop_after_end``: up to the first step in which a sequence finished);
    returns how many were run (0: none could be)."""
    seqs = [e.seq for e in plan.scheduled if e.seq.status is Status.RUNNING]
    if not seqs or len(seqs) != engine.scheduler.num_unfinished():
        return 0  # someone waits (or is swapped, or loading): the scheduler decides every step
    for seq in seqs:
        if seq.num_tokens - seq.num_computed_tokens != 1 or seq.num_computed_tokens < seq.request.prompt_len:
            return 0  # a prompt chunk is still to come
    now = engine.now()
    if now + MIN_SPAN_STEPS * engine.last_step_s >= until:
        return 0  # no room for a span worth its set-up
    steps, at_s = next_decision(engine, now)
    limit = min(until, at_s)
    if steps == 0 or now >= limit:
        return 0
    return _Span(engine, seqs).run(steps, limit, on_step_start, stop_after_end)


class _Span:
    """The sequences of one span (in plan order) and how far each has been brought up to date."""

    def __init__(self, engine: Engine, seqs: list[Sequence]) -> None:
        self.engine = engine
        self.seqs = seqs
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

    def run(self, max_steps: int, limit: float, on_step_start: Callable[[], None] | None,
            stop_after_end: bool = False) -> int:
        """Run up to ``max_steps`` span steps, none starting at or after ``limit``, through the
        engine's step phases (``price``, ``apply``, ``record``); returns how many ran.

        One ``apply`` per span step: it brings the sequences with an event at the *next* step up
        to date (their ``quiet`` pairs, this step's tokens included), then takes this step's event
        entries; so when a step starts, its due sequences are up to date for their allocations.
        Nothing reads a sequence between the two (a span runs no policy), so this is the order the
        step-by-step path leaves."""
        engine, seqs, events, ends, synced = self.engine, self.seqs, self.events, self.ends, self.synced
        allocator, token = engine.allocator, self.token
        count_quiet, apply, price, record = allocator.count_quiet_decodes, engine.apply, engine.price, engine.record
        deliver = engine.deliver
        no_plan, no_output = SchedulePlan(), StepOutput([], 0.0)  # a quiet step preempts and moves nothing
        events_plan, events_output = SchedulePlan(), StepOutput([], 0.0)  # refilled each step (apply keeps neither)
        entries: list[ScheduledSeq | None] = [None] * len(seqs)  # each sequence's event entry, made once, reused
        active = len(seqs)
        context = sum(seq.num_tokens for seq in seqs)  # each decode attends to its whole context
        step = 0
        due: list[int] = []  # the sequences with an event at ``step`` (up to date), in plan order
        while events and events[0][0] == 0:
            due.append(heapq.heappop(events)[1])
        while step < max_steps and active:
            start = engine.now()
            if start >= limit:
                break
            if due and len(due) > allocator.num_free_blocks():  # each may need a block: the scheduler decides
                break
            if on_step_start is not None:
                on_step_start()
            for i in due:  # their allocations, in plan order, as schedule() makes them
                if not allocator.allocate_slots(seqs[i], 1):
                    raise RuntimeError(f"allocator plugin {type(allocator).name!r} refused one decode slot for "
                                       f"{seqs[i].id!r} with {allocator.num_free_blocks()} free blocks: its "
                                       "quiet_decode_tokens() contract says such a step takes at most one block")
            n = active
            if n > len(due):
                count_quiet(n - len(due))
            work = StepWork(n, n, 0, n, n, context, context)
            end = price(work)
            stamp = deliver(end, n)  # when the client gets the step's tokens
            ends.append(stamp)
            step += 1
            upcoming: list[int] = []  # events at the next step of sequences without one now
            while events and events[0][0] == step:
                upcoming.append(heapq.heappop(events)[1])
            lag = self._lag(upcoming, step)
            left_tokens = 0
            if due:  # their tokens and finishes, in plan order
                scheduled = []
                for i in due:
                    entry = entries[i]
                    seq = seqs[i]
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
                        at = self._next_event(seq, step)
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
            due = upcoming
            context += n - left_tokens
            record(None, work, start, end)
            if stop_after_end and left_tokens:
                break
        lag = self._lag((i for i, seq in enumerate(seqs) if seq.status is Status.RUNNING), step)
        if lag:
            apply(no_plan, no_output, engine.now(), quiet=lag)
        return step
