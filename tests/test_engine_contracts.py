"""The engine's explicit state: a one-way step, one clock, checked sequence transitions."""

from __future__ import annotations

import pytest

from servelab.core.request import ALLOWED_TRANSITIONS, IllegalTransition, Request, Sequence, Status
from servelab.engine.clock import Clock, ModelledClock, WallClock
from servelab.kit.testing import VirtualClock


def _req(i, prompt_len=8, max_tokens=4):
    return Request(f"r{i}", tuple(range(1, prompt_len + 1)), max_tokens)


def test_the_executor_gets_a_finished_batch_and_never_reaches_a_policy(fake_stack):
    """Block tables are read by the engine before execute(); during execute() no allocator,
    scheduler or preemption method may run (a tripwire on each plugin object)."""
    stack, _ = fake_stack("max_num_seqs=4", "block_size=4")
    engine = stack.engine
    executing = {"now": False}
    touched: list[str] = []
    for role in ("allocator", "scheduler"):
        plugin = getattr(engine, role)
        for name in dir(type(plugin)):
            attr = getattr(plugin, name, None)
            if name.startswith("__") or not callable(attr):
                continue

            def tripwire(*a, _f=attr, _n=f"{role}.{name}", **k):
                if executing["now"]:
                    touched.append(_n)
                return _f(*a, **k)
            setattr(plugin, name, tripwire)
    execute = engine.executor.execute

    def guarded(batch):
        executing["now"] = True
        try:
            return execute(batch)
        finally:
            executing["now"] = False
    engine.executor.execute = guarded
    for i in range(3):
        engine.add_request(_req(i))
    while engine.has_unfinished():
        engine.step()
    batch = engine.executor.batches[-1]
    assert batch.block_tables.shape[0] == len(batch.cu_seqlens_q) - 1  # the tables travel in the batch
    assert touched == []


def test_the_simulator_gets_the_steps_work_not_a_batch(tmp_path):
    from servelab.api import compose
    from servelab.assemble.stack import build_stack

    cfg = compose(["backend=sim", "hardware=h100", "model=llama3_8b", "workload.num_requests=4"], logger="none")
    stack = build_stack(cfg)
    assert not stack.engine.executor.needs_batch
    calls = []
    work_fn = stack.engine.executor.execute_work
    stack.engine.executor.execute_work = lambda work: (calls.append(work), work_fn(work))[1]
    stack.engine.executor.execute = lambda batch: pytest.fail("the simulator was handed a batch")
    stack.engine.add_request(_req(0, 16, 3))
    while stack.engine.has_unfinished():
        stack.engine.step()
    assert [w.num_sampled for w in calls] == [1, 1, 1]


def test_every_clock_implements_the_protocol():
    class Predicts:
        measured = False
        name = "const"

        def predict(self, work):
            return 0.5
    for clock in (WallClock(), ModelledClock(Predicts()), VirtualClock()):
        assert isinstance(clock, Clock)
    virtual = ModelledClock(Predicts())
    virtual.end_step(None)
    virtual.sleep(1.0)
    assert virtual.now() == 1.5


def test_a_sequence_moves_only_along_allowed_transitions():
    seq = Sequence(_req(0))
    seq.status = Status.RUNNING
    seq.status = Status.SWAPPED
    seq.status = Status.RUNNING
    seq.status = Status.WAITING  # a recompute preemption
    seq.move_to(Status.RUNNING)
    seq.finish("length", 1.0)
    with pytest.raises(IllegalTransition, match=r"'r0' cannot go from finished to running"):
        seq.status = Status.RUNNING
    fresh = Sequence(_req(1))
    with pytest.raises(IllegalTransition, match="from waiting to swapped"):
        fresh.move_to(Status.SWAPPED)
    assert all(not ALLOWED_TRANSITIONS[s] for s in (Status.FINISHED, Status.REJECTED, Status.ABORTED))


def test_a_sequence_ends_only_through_finish_or_reject():
    """Status, reason and time are set together; an ended state is not reachable by move_to."""
    for end in (Status.FINISHED, Status.ABORTED, Status.REJECTED):
        seq = Sequence(_req(0))
        with pytest.raises(IllegalTransition, match=r"finish\(reason, now\) or reject\(reason, now\)"):
            seq.move_to(end)
        with pytest.raises(IllegalTransition):
            seq.status = end
        assert seq.status is Status.WAITING and seq.finish_time is None
    for reason, status in (("length", Status.FINISHED), ("stop", Status.FINISHED), ("abort", Status.ABORTED)):
        seq = Sequence(_req(0))
        seq.move_to(Status.RUNNING)
        seq.finish(reason, 2.5)
        assert (seq.status, seq.finish_reason, seq.finish_time, seq.rejected_reason) == (status, reason, 2.5, None)
        with pytest.raises(IllegalTransition, match="cannot go from"):
            seq.finish(reason, 3.0)
        assert seq.finish_time == 2.5
    with pytest.raises(ValueError, match="finish reason 'done'"):
        Sequence(_req(0)).finish("done", 1.0)
    seq = Sequence(_req(0))
    seq.reject("prompt longer than max_model_len", 0.5)
    assert (seq.status, seq.rejected_reason, seq.finish_time, seq.finish_reason) == (
        Status.REJECTED, "prompt longer than max_model_len", 0.5, None)
    running = Sequence(_req(1))
    running.move_to(Status.RUNNING)
    with pytest.raises(IllegalTransition, match="from running to rejected"):
        running.reject("too late", 1.0)


def test_token_ids_is_a_read_only_view_that_follows_the_sequence():
    seq = Sequence(_req(0))
    view = seq.token_ids
    prompt = list(seq.request.prompt_token_ids)
    assert view == prompt and list(view) == prompt and len(view) == seq.num_tokens
    with pytest.raises(AttributeError):
        view.append(7)  # type: ignore[attr-defined]
    with pytest.raises(TypeError):
        view[0] = 7  # type: ignore[index]
    part = view[:2]
    part.append(99)  # a slice is a new list: the sequence is untouched
    assert seq.num_tokens == len(prompt)
    seq.append_token(7, 0.1)
    assert seq.token_ids is view and view[-1] == 7 and len(view) == len(prompt) + 1 and 7 in view
    seq.move_to(Status.RUNNING)
    seq.finish("length", 0.2)
    seq.compact()  # finished: a view of prompt + outputs, still read-only and equal
    assert seq.token_ids == [*prompt, 7] and seq.token_ids[-1] == 7
    with pytest.raises(AttributeError):
        seq.token_ids.append(8)  # type: ignore[attr-defined]

