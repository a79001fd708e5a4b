"""The abort path (a client that leaves): ``Engine.abort`` ends a request in any state — waiting,
running mid-prefill or decoding, swapped to the host pool, holding drafts — frees every block it
holds, tells the drafter, records it as aborted, and changes no other request's tokens."""

from __future__ import annotations

import pytest

from servelab.engine.engine import PluginFailure
from servelab.core.interfaces import SchedulePlan, Scheduler, SpeculativeDrafter
from servelab.core.request import Request, Status
from servelab.engine.scheduling import QueueScheduler
from servelab.run.session import collect_results

from memory_helpers import fake_stack, run_requests, tokens_by_id


def _requests(n=5, prompt=24, out=12):
    return [Request(f"r{i}", tuple(range(i * 50 + 1, i * 50 + 1 + prompt)), out) for i in range(n)]


def _step_until(engine, predicate, limit=500):
    for _ in range(limit):
        if predicate():
            return
        engine.step()
    raise AssertionError("the state the test waits for never came")


def _finish(engine, limit=5_000):
    for _ in range(limit):
        if not engine.has_unfinished():
            return
        engine.step()
    raise AssertionError("the run did not end")


def _check_others_unchanged(stack, requests, aborted, overrides, num_blocks, num_swap_blocks=0):
    """The requests not aborted finished with the tokens they get when nobody is aborted."""
    expected = tokens_by_id(run_requests(fake_stack(overrides, num_blocks, num_swap_blocks),
                                         [r for r in requests if r.id not in aborted]))
    result = collect_results(stack.engine, 1.0)
    got = {r["id"]: r for r in result.requests}
    for rid, tokens in expected.items():
        assert got[rid]["finish_reason"] == "length", got[rid]
        assert got[rid]["output_token_ids"] == tokens, rid
    for rid in aborted:
        assert got[rid]["finish_reason"] == "abort" and got[rid]["met_slo"] is None
    assert result.summary["num_aborted"] == len(aborted)
    assert result.summary["num_finished"] == len(expected)
    assert result.summary["leaked_blocks"] == 0
    assert stack.engine.allocator.leaked_blocks() == 0
    assert stack.engine.scheduler.num_unfinished() == 0


@pytest.mark.parametrize("scheduler", ["fcfs", "priority", "slo_aware", "static"])
def test_abort_a_waiting_and_a_running_request(scheduler):
    overrides = [f"scheduler={scheduler}", "block_size=4", "max_num_seqs=2", "slo.ttft_ms=1000"]
    stack = fake_stack(overrides, 64)
    engine = stack.engine
    requests = _requests()
    seqs = {r.id: engine.add_request(r) for r in requests}
    _step_until(engine, lambda: seqs["r0"].num_output_tokens >= 2)
    assert seqs["r3"].status is Status.WAITING and seqs["r0"].status is Status.RUNNING
    before = engine.scheduler.num_unfinished()
    assert engine.abort("r3") and engine.abort("r0")
    assert engine.scheduler.num_unfinished() == before - 2
    assert not engine.abort("r0") and not engine.abort("nobody")  # already ended / unknown: nothing to do
    assert seqs["r0"].status is Status.ABORTED and seqs["r0"].finish_reason == "abort"
    assert engine.allocator.block_table("r0") == []
    _finish(engine)
    _check_others_unchanged(stack, requests, {"r0", "r3"}, overrides, 64)


def test_abort_mid_prefill_frees_the_chunks_computed_so_far():
    overrides = ["block_size=4", "max_num_batched_tokens=8", "max_num_seqs=4"]
    stack = fake_stack(overrides, 64)
    engine = stack.engine
    requests = _requests(n=3, prompt=30)
    seqs = {r.id: engine.add_request(r) for r in requests}
    _step_until(engine, lambda: 0 < seqs["r1"].num_computed_tokens < 30)
    assert seqs["r1"].status is Status.RUNNING and seqs["r1"].is_prefill
    assert engine.allocator.block_table("r1")
    assert engine.abort("r1")
    assert engine.allocator.block_table("r1") == []
    _finish(engine)
    _check_others_unchanged(stack, requests, {"r1"}, overrides, 64)


def test_abort_a_swapped_request_frees_its_host_blocks():
    overrides = ["block_size=4", "preemption=swap"]
    stack = fake_stack(overrides, 24, num_swap_blocks=64)
    engine = stack.engine
    requests = _requests(n=6, out=16)
    seqs = {r.id: engine.add_request(r) for r in requests}
    _step_until(engine, lambda: any(s.status is Status.SWAPPED for s in seqs.values()))
    victim = next(s for s in seqs.values() if s.status is Status.SWAPPED)
    allocator = engine.allocator
    free_host = len(allocator.free_host)
    assert engine.abort(victim.id)
    assert len(allocator.free_host) > free_host  # its host blocks went back to the pool
    assert victim not in engine.scheduler.swapped
    _finish(engine)
    _check_others_unchanged(stack, requests, {victim.id}, overrides, 24, 64)


class _AlwaysDrafts(SpeculativeDrafter):
    """Proposes ``k`` zeros for every sequence (mostly rejected: the point is holding drafts)."""

    name = "always_drafts_for_abort_test"

    def __init__(self):
        super().__init__(None, None)
        self.forgotten = []

    @property
    def num_speculative_tokens(self):
        return 3

    def propose(self, seqs, k):
        return [[0] * k for _ in seqs]

    def forget(self, seq):
        self.forgotten.append(seq.id)


def test_abort_with_drafts_makes_the_drafter_forget():
    overrides = ["block_size=4"]
    stack = fake_stack(overrides, 64)
    engine = stack.engine
    engine.drafter = drafter = _AlwaysDrafts()
    requests = _requests(n=3)
    seqs = {r.id: engine.add_request(r) for r in requests}
    _step_until(engine, lambda: bool(seqs["r0"].draft_token_ids))
    assert engine.abort("r0")
    assert drafter.forgotten == ["r0"] and engine.allocator.block_table("r0") == []
    _finish(engine)
    _check_others_unchanged(stack, requests, {"r0"}, overrides, 64)


def test_a_queue_scheduler_subclass_inherits_abort():
    class Lifo(QueueScheduler):
        name = "lifo_for_abort_test"

        def waiting_key(self):
            return lambda seq: -seq.arrival_s

    stack = fake_stack(["max_num_seqs=1"], 64)
    engine = stack.engine
    s = stack.engine.scheduler
    engine.scheduler = Lifo(s.config, s.context)
    for r in _requests(n=3):
        engine.add_request(r)
    engine.step()
    assert engine.abort("r1") and engine.abort("r2")
    _finish(engine)
    assert engine.allocator.leaked_blocks() == 0 and engine.scheduler.num_unfinished() == 0


def test_a_scheduler_that_keeps_an_aborted_request_is_named():
    class Forgetful(Scheduler):
        """remove() only knows running sequences: the default abort() then leaves a waiting one."""

        name = "forgetful"

        def __init__(self, *args):
            super().__init__(*args)
            self.waiting = []

        def add(self, seq):
            self.waiting.append(seq)

        def schedule(self, now):
            return SchedulePlan()

        def remove(self, seq):
            pass

        def num_unfinished(self):
            return len(self.waiting)

    stack = fake_stack([], 64)
    s = stack.engine.scheduler
    stack.engine.scheduler = Forgetful(s.config, s.context)
    stack.engine.add_request(_requests(n=1)[0])
    with pytest.raises(PluginFailure, match="'forgetful' still holds aborted request 'r0'"):
        stack.engine.abort("r0")


def test_stop_ends_a_request_as_finished_by_a_stop_string():
    stack = fake_stack(["block_size=4"], 64)
    engine = stack.engine
    requests = _requests(n=2)
    seqs = {r.id: engine.add_request(r) for r in requests}
    _step_until(engine, lambda: seqs["r0"].num_output_tokens >= 3)
    tokens = list(seqs["r0"].output_token_ids)
    assert engine.stop("r0") and not engine.stop("r0")
    assert seqs["r0"].status is Status.FINISHED and seqs["r0"].finish_reason == "stop"
    _finish(engine)
    result = collect_results(engine, 1.0)
    rec = result.by_id()["r0"]
    assert rec["output_token_ids"] == tokens and rec["ttft_ms"] is not None  # a finished request's figures
    assert result.summary["num_finished"] == 2 and result.summary["num_aborted"] == 0
    assert result.summary["leaked_blocks"] == 0
