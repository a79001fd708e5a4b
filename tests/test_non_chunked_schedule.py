"""``non_chunked_schedule`` (chunked_prefill=false): prefill_first runs waiting prompts whole in
prompt-only steps as vLLM v0 does; decode_first keeps the old plan (running first, prompts into
what is left). Fake executor + virtual clock, no model."""

from __future__ import annotations

import pytest

from test_schedulers import compose, fake_engine, req, run

NON_CHUNKED = ("chunked_prefill=false", "max_num_batched_tokens=128", "max_model_len=128", "max_num_seqs=8")


def plans(engine) -> list[list[tuple[str, int]]]:
    return [list(s.scheduled) for s in engine.steps]


def admission_step(engine, rid: str):
    return next(s for s in engine.steps if (rid, 60) in s.scheduled or (rid, 100) in s.scheduled)


def test_prefill_first_is_the_default_and_pauses_decodes_for_a_prompt():
    engine, clock = fake_engine("fcfs", *NON_CHUNKED)
    assert engine.limits.non_chunked_schedule == "prefill_first"
    run(engine, clock, [req("a", 8, 20), req("b", 100, 3, arrival=0.02)])
    step = admission_step(engine, "b")
    assert step.scheduled == [("b", 100)]  # prompt-only: a's decode waits this step
    after = engine.steps[step.step + 1]
    assert after.scheduled == [("a", 1), ("b", 1)]  # then both decode


def test_decode_first_keeps_the_old_plan():
    engine, clock = fake_engine("fcfs", *NON_CHUNKED, "non_chunked_schedule=decode_first")
    run(engine, clock, [req("a", 8, 20), req("b", 100, 3, arrival=0.02)])
    assert admission_step(engine, "b").scheduled == [("a", 1), ("b", 100)]


def test_prefill_first_admits_waiting_prompts_in_order_while_the_budget_allows():
    engine, clock = fake_engine("fcfs", *NON_CHUNKED)
    run(engine, clock, [req("a", 60, 4), req("b", 60, 4), req("c", 60, 4)])
    assert plans(engine)[:3] == [[("a", 60), ("b", 60)],  # c does not fit the 128-token budget
                                 [("c", 60)],  # prompt-only: a and b wait
                                 [("a", 1), ("b", 1), ("c", 1)]]
    engine, clock = fake_engine("fcfs", *NON_CHUNKED, "non_chunked_schedule=decode_first")
    run(engine, clock, [req("a", 60, 4), req("b", 60, 4), req("c", 60, 4)])
    assert plans(engine)[:2] == [[("a", 60), ("b", 60)], [("a", 1), ("b", 1), ("c", 60)]]


def test_prefill_first_respects_max_num_seqs():
    engine, clock = fake_engine("fcfs", *NON_CHUNKED[:3], "max_num_seqs=2")
    run(engine, clock, [req("a", 10, 6), req("b", 10, 6), req("c", 10, 6)])
    assert plans(engine)[:2] == [[("a", 10), ("b", 10)], [("a", 1), ("b", 1)]]  # no seat for c
    assert all(len(p) <= 2 for p in plans(engine))


def test_prefill_first_preempts_nobody_for_a_prompt_that_does_not_fit():
    # 12 blocks of 16: a holds 7 (100 tokens), then 8; b needs 7: only 5, then 4, are free
    engine, clock = fake_engine("fcfs", *NON_CHUNKED[:3], "max_num_seqs=8", "block_size=16", num_kv_blocks=12)
    run(engine, clock, [req("a", 100, 40), req("b", 100, 3, arrival=0.01)])
    assert not any(s.preempted for s in engine.steps)
    b = admission_step(engine, "b")
    assert b.scheduled == [("b", 100)] and b.step > 20  # once a ended (at max_model_len)
    assert all(("a", 1) in s.scheduled for s in engine.steps[1:b.step])  # a decoded while b waited


@pytest.mark.parametrize("schedule", ["prefill_first", "decode_first"])
def test_chunked_prefill_on_ignores_the_choice(schedule):
    base = ("max_num_batched_tokens=32", "max_num_seqs=8")
    reference, clock = fake_engine("fcfs", *base)
    run(reference, clock, [req("a", 8, 20), req("b", 100, 3, arrival=0.02)])
    engine, clock = fake_engine("fcfs", *base, f"non_chunked_schedule={schedule}")
    run(engine, clock, [req("a", 8, 20), req("b", 100, 3, arrival=0.02)])
    assert plans(engine) == plans(reference)


@pytest.mark.parametrize("scheduler", ["static", "priority", "slo_aware", "mlfq", "sjf length_predictor=oracle"])
def test_every_scheduler_finishes_under_prefill_first(scheduler):
    engine, clock = fake_engine(scheduler.split()[0], *scheduler.split()[1:], *NON_CHUNKED, num_kv_blocks=20)
    requests = [req(f"r{i}", 20 + 7 * i, 5 + i, arrival=0.003 * i, priority=i % 3) for i in range(10)]
    out = run(engine, clock, requests)
    assert all(out[r.id]["output_len"] == r.max_tokens for r in requests)
    for s in engine.steps:  # a step that admitted a prompt ran no decode
        prompts = [n for _, n in s.scheduled if n > 1]
        assert not prompts or len(prompts) == len(s.scheduled)


def test_an_unknown_schedule_is_refused_at_compose():
    with pytest.raises(Exception, match="non_chunked_schedule"):
        compose(["non_chunked_schedule=mixed"], logger="none")
