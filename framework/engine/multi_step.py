"""Multi-step scheduling (``num_scheduler_steps``, vLLM's ``--num-scheduler-steps``): after a
decode-only plan the engine runs up to N-1 more decode steps of the same sequences without asking
the scheduler — a *window* of at most N steps.

- Each step of a window gives every sequence still in it one token; its slot comes from the
  allocator (``allocate_slots(seq, 1)``). A sequence that finishes drops out; if a slot cannot
  be allocated the window ends before that step (the slots already made are the ones the next
  step needs) and the scheduler runs next (it may preempt).
- Nothing else happens inside a window: new arrivals, swapped and waiting sequences wait for its
  end (the scheduler is not called), and no step of a window preempts.
- Delivery: the tokens of a window reach the client at the window's end (vLLM 0.6.0 streams
  multi-step output in chunks of N): every token a window computed is time-stamped with the
  window's end, and a sequence that finished inside it ends then (its TTFT, ITL and E2E count
  from there). Its blocks are freed at that moment too. With a front end (``frontend=...``) the
  window's tokens go through it as one output batch (:meth:`FrontEnd.deliver`).
- Prefill steps stay single steps: a plan with any prompt chunk, recomputation or draft verify is
  no window. Every step is priced and recorded as a step of its own (``steps.jsonl``, totals).

Tokens never change with N (each step computes the same decode as step by step); only timing does.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from servelab.core.interfaces import SchedulePlan, ScheduledSeq
from servelab.core.request import Sequence, Status
from servelab.engine.batch import step_work

if TYPE_CHECKING:
    from servelab.engine.engine import Engine, StepRecord


def starts_window(plan: SchedulePlan) -> bool:
    """Whether ``plan`` may open a window: every entry is one plain decode token (no prompt chunk,
    recomputation or drafts)."""
    return bool(plan.scheduled) and all(e.num_tokens == 1 and not e.draft_token_ids and e.start >= e.seq.request.prompt_len
               for e in plan.scheduled)


def run_window(engine: Engine, plan: SchedulePlan, start: float, num_steps: int) -> StepRecord:
    """Run ``plan`` (decode-only, just scheduled at ``start``) and up to ``num_steps - 1`` more decode
    steps of its sequences through the engine's step phases; deliver the window's tokens at its end.
    Returns the last step's record."""
    window: dict[str, tuple[Sequence, int]] = {}  # id -> (seq, output tokens before the window)
    ended: list[tuple[Sequence, str]] = []  # finished inside the window, ended at its end
    record = None
    for k in range(num_steps):
        if k:
            start = engine.now()
            following = _next_plan(engine, plan, ended)
            if following is None:
                break
            plan = following
        for e in plan.scheduled:
            window.setdefault(e.seq.id, (e.seq, e.seq.num_output_tokens))
        work = step_work(plan)
        output = engine.execute(plan, work)
        end = engine.price(work)
        engine.apply(plan, output, end, ended=ended)  # finishes wait for the window's end
        record = engine.record(plan, work, start, end, output)
    assert record is not None  # the first step always runs
    delivered = engine.now()
    new_tokens = sum(len(seq.token_times) - before for seq, before in window.values())
    stamp = engine.deliver(delivered, new_tokens)
    for seq, before in window.values():
        times = seq.token_times
        for i in range(before, len(times)):
            times[i] = stamp
    for seq, reason in ended:
        engine.finish(seq, reason, delivered)
    if engine.connector is not None:
        engine.connector.save_kv()  # sends of the sequences that ended in the window and were kept
    return record


def _next_plan(engine: Engine, plan: SchedulePlan, ended: list[tuple[Sequence, str]]) -> SchedulePlan | None:
    """The next window step: one slot for each sequence of ``plan`` still in the window, in plan
    order; None when nobody is left or a slot cannot be allocated (the window ends)."""
    done = {id(seq) for seq, _ in ended}
    seqs = [e.seq for e in plan.scheduled if e.seq.status is Status.RUNNING and id(e.seq) not in done]
    if not seqs:
        return None
    allocate = engine.allocator.allocate_slots
    for seq in seqs:
        if not allocate(seq, 1):
            return None
    return SchedulePlan(scheduled=[ScheduledSeq(seq, 1, seq.num_computed_tokens) for seq in seqs])
