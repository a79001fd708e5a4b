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
    from servelab.run.stack import build_stack

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
    seq.move_to(Status.FINISHED)
    with pytest.raises(IllegalTransition, match=r"'r0' cannot go from finished to running"):
        seq.status = Status.RUNNING
    fresh = Sequence(_req(1))
    with pytest.raises(IllegalTransition, match="from waiting to swapped"):
        fresh.move_to(Status.SWAPPED)
    assert all(not ALLOWED_TRANSITIONS[s] for s in (Status.FINISHED, Status.REJECTED, Status.ABORTED))

