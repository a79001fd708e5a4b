"""The engine's continuous batching, on a model-free stack (FakeExecutor + virtual clock)."""

from __future__ import annotations

import pytest

from servelab.engine.engine import PluginFailure
from servelab.core.request import Request, Status
from servelab.run.runner import run_workload
from servelab.run.session import collect_results


def _req(i, prompt_len, max_tokens, arrival=0.0):
    return Request(f"r{i}", tuple(range(1, prompt_len + 1)), max_tokens, arrival)


def test_requests_join_and_leave_at_step_boundaries(fake_stack):
    stack, clock = fake_stack("max_num_batched_tokens=64", "max_num_seqs=4")
    engine = stack.engine
    short, long_ = engine.add_request(_req(0, 8, 2)), engine.add_request(_req(1, 8, 10))
    engine.step()  # both prefills
    assert short.num_output_tokens == long_.num_output_tokens == 1
    engine.step()
    assert short.status == Status.FINISHED  # leaves as soon as it is done
    late = engine.add_request(_req(2, 8, 3))  # joins while the other is mid-decode
    record = engine.step()
    assert record.num_seqs == 2 and record.prefill_tokens == 8 and record.decode_seqs == 1
    while engine.has_unfinished():
        engine.step()
    assert late.status == long_.status == Status.FINISHED
    assert [s.num_output_tokens for s in (short, long_, late)] == [2, 10, 3]
    assert engine.allocator.leaked_blocks() == 0


def test_chunked_prefill_mixes_chunks_with_decodes_within_budget(fake_stack):
    stack, _ = fake_stack("max_num_batched_tokens=32", "max_num_seqs=8", "block_size=4")
    engine = stack.engine
    engine.add_request(_req(0, 4, 20))
    engine.step()
    engine.add_request(_req(1, 100, 2))
    records = [engine.step() for _ in range(4)]
    assert all(r.num_tokens <= 32 for r in records)
    assert [r.decode_seqs for r in records] == [1, 1, 1, 1]  # the decode is never starved
    assert [r.prefill_tokens for r in records[:3]] == [31, 31, 31]


def test_without_chunking_a_prompt_waits_until_it_fits_whole(fake_stack):
    stack, _ = fake_stack("chunked_prefill=false", "max_num_batched_tokens=128", "max_model_len=128")
    engine = stack.engine
    engine.add_request(_req(0, 100, 5))
    engine.add_request(_req(1, 100, 5))
    record = engine.step()
    assert record.num_tokens == 100  # the second prompt does not fit the rest of the budget


def test_max_num_seqs_caps_the_batch(fake_stack):
    stack, _ = fake_stack("max_num_seqs=3")
    engine = stack.engine
    for i in range(5):
        engine.add_request(_req(i, 4, 4))
    assert engine.step().num_seqs == 3


def test_impossible_requests_are_rejected_with_reasons_and_others_finish(fake_stack):
    stack, clock = fake_stack("max_model_len=64", "block_size=4", num_kv_blocks=10)
    engine = stack.engine
    reqs = [_req(0, 80, 4), _req(1, 30, 30), _req(2, 8, 4), Request("empty", (), 4), _req(3, 4, 0)]
    run_workload(engine, reqs, sleep=clock.sleep)
    result = collect_results(engine, 1.0).by_id()
    assert "max_model_len=64" in result["r0"]["rejected_reason"]
    assert "whole pool has 10 blocks" in result["r1"]["rejected_reason"]
    assert result["empty"]["rejected_reason"] == "empty prompt"
    assert "max_tokens=0" in result["r3"]["rejected_reason"]
    assert result["r2"]["finish_reason"] == "length" and result["r2"]["output_len"] == 4


def test_arrival_times_are_honoured_on_the_clock(fake_stack):
    stack, clock = fake_stack("workload.time_scale=2.0")
    engine = stack.engine
    reqs = [_req(0, 8, 3, arrival=0.0), _req(1, 8, 3, arrival=1.0)]
    run_workload(engine, reqs, time_scale=2.0, sleep=clock.sleep)
    late = engine.sequences["r1"]
    assert late.first_scheduled_time >= 2.0  # arrival 1.0 s scaled by 2
    rec = collect_results(engine, 2.0).by_id()["r1"]
    assert rec["arrival_s"] == 2.0 and 0 <= rec["queue_ms"] < 100 and rec["ttft_ms"] > 0


def test_pool_exhaustion_preempts_the_newest_and_recomputes(fake_stack):
    stack, clock = fake_stack("block_size=4", "max_num_batched_tokens=64", num_kv_blocks=6)
    engine = stack.engine
    reqs = [_req(i, 6, 10) for i in range(3)]
    run_workload(engine, reqs, sleep=clock.sleep)
    result = collect_results(engine, 1.0)
    assert result.summary["num_preemptions"] > 0
    assert result.summary["num_finished"] == 3 and result.summary["leaked_blocks"] == 0
    assert engine.sequences["r0"].num_preemptions == 0  # the oldest keeps running under FCFS


def test_outputs_do_not_depend_on_pool_size(fake_stack):
    outputs = []
    for blocks in (1000, 7):
        stack, clock = fake_stack("block_size=4", num_kv_blocks=blocks)
        run_workload(stack.engine, [_req(i, 5 + i, 8) for i in range(6)], sleep=clock.sleep)
        outputs.append({k: s.output_token_ids for k, s in stack.engine.sequences.items()})
    assert outputs[0] == outputs[1]


def test_a_failing_plugin_is_named_with_the_step(fake_stack):
    stack, _ = fake_stack()
    engine = stack.engine

    def boom(now):
        raise ValueError("bad plan")

    engine.scheduler.schedule = boom
    engine.add_request(_req(0, 4, 2))
    with pytest.raises(PluginFailure, match=r"scheduler plugin 'fcfs' failed at step 0: ValueError: bad plan"):
        engine.step()


def test_duplicate_request_ids_are_refused(fake_stack):
    stack, _ = fake_stack()
    stack.engine.add_request(_req(0, 4, 2))
    with pytest.raises(ValueError, match="duplicate request id 'r0'"):
        stack.engine.add_request(_req(0, 4, 2))
