"""``num_scheduler_steps`` (multi-step scheduling): windows of decode steps run without the
scheduler, arrivals wait for a window's end, a window's tokens are delivered at its end; tokens
never change (fake executor, the simulator, and the real tiny_code model)."""

from __future__ import annotations

import statistics

import pytest

from servelab.core.errors import ConfigError
from servelab.core.request import Request
from servelab.run.runner import run_workload
from servelab.run.session import collect_results, run_job
from servelab.assemble.stack import build_stack
from servelab.assemble.validate import validate
from test_schedulers import compose, fake_engine, req, run


def counting_schedules(engine) -> list[float]:
    """Record the time of every scheduler call."""
    calls: list[float] = []
    schedule = engine.scheduler.schedule

    def counted(now):
        calls.append(now)
        return schedule(now)

    engine.scheduler.schedule = counted
    return calls


def test_a_window_runs_n_decode_steps_per_scheduler_call():
    engine, clock = fake_engine("fcfs", "num_scheduler_steps=4")
    calls = counting_schedules(engine)
    out = run(engine, clock, [req("a", 8, 13)])
    assert out["a"]["output_len"] == 13
    assert len(engine.steps) == 13  # one prefill step (token 1) + 12 decode steps
    assert len(calls) == 1 + 3  # the prefill, then one call per window of 4
    times = out["a"]["itl_ms"]  # tokens 2-5, 6-9, 10-13 each delivered at their window's end
    assert [t == 0 for t in times] == [False, True, True, True] * 3


def test_one_scheduler_step_is_the_old_engine():
    a, clock = fake_engine("fcfs")
    calls = counting_schedules(a)
    run(a, clock, [req("a", 8, 13)])
    assert len(calls) == 13 and a.limits.num_scheduler_steps == 1


def test_arrivals_wait_for_the_window_end_and_prefills_stay_single_steps():
    engine, clock = fake_engine("fcfs", "num_scheduler_steps=8")
    out = run(engine, clock, [req("a", 8, 30), req("b", 8, 4, arrival=0.02)])
    b_first = next(s for s in engine.steps if ("b", 8) in s.scheduled)
    window = [s for s in engine.steps if 1 <= s.step < b_first.step]
    assert all(s.scheduled == [("a", 1)] for s in window)
    assert len(window) % 8 == 0  # b joined at a window boundary, not at the first step after its arrival
    assert engine.steps[b_first.step - 8].time_s - engine.steps[b_first.step - 8].duration_s <= 0.02
    assert out["b"]["output_len"] == 4 and out["a"]["output_len"] == 30
    assert out["b"]["ttft_ms"] > 0


def test_a_sequence_that_finishes_inside_a_window_ends_at_its_end():
    engine, clock = fake_engine("fcfs", "num_scheduler_steps=6")
    run(engine, clock, [req("short", 8, 3), req("long", 8, 12)])
    short, long_ = engine.sequences["short"], engine.sequences["long"]
    window_end = engine.steps[6].time_s  # step 0 prefills both, steps 1-6 are the first window
    assert short.finish_time == window_end == short.token_times[-1] == short.token_times[1]
    assert list(long_.token_times[1:7]) == [window_end] * 6
    assert engine.steps[2].scheduled == [("short", 1), ("long", 1)]  # short's last token
    assert engine.steps[3].scheduled == [("long", 1)]  # then it dropped out


def test_a_window_ends_early_when_a_slot_cannot_be_allocated():
    # block_size 4, 9 blocks: both grow until the pool runs out inside a window; the scheduler then preempts
    kwargs = dict(num_kv_blocks=9)
    args = ("block_size=4", "max_model_len=64", "max_num_batched_tokens=64")
    requests = [req("a", 8, 12), req("b", 8, 12)]
    reference, clock = fake_engine("fcfs", *args, **kwargs)
    expected = run(reference, clock, requests)
    engine, clock = fake_engine("fcfs", *args, "num_scheduler_steps=4", **kwargs)
    out = run(engine, clock, requests)  # no leaked blocks (run() checks)
    assert any(s.preempted for s in engine.steps)
    assert {k: v["output_token_ids"] for k, v in out.items()} == {k: v["output_token_ids"] for k, v in expected.items()}


def test_config_checks():
    with pytest.raises(ConfigError, match="num_scheduler_steps=0"):
        validate(compose(["num_scheduler_steps=0"], logger="none"))
    with pytest.raises(ConfigError, match="drafter=ngram"):
        validate(compose(["num_scheduler_steps=4", "drafter=ngram"], logger="none"))


SIM = ["backend=sim", "model=llama3_8b", "hardware=h100", "workload.num_requests=40", "workload.rate=8",
       "workload.output_len.min=32", "workload.output_len.max=96"]


def _sim(tmp_path, *overrides: str):
    cfg = compose([*SIM, *overrides], logger="none", progress=False)
    stack = build_stack(cfg)
    return stack.engine, run_job(cfg, tmp_path / "_".join(overrides or ("one",)), stack=stack)


def test_simulator_ttft_grows_with_the_window_and_fast_forward_is_off(tmp_path):
    one, r1 = _sim(tmp_path)
    ten, r10 = _sim(tmp_path, "num_scheduler_steps=10")
    assert ten.num_fast_forwarded == 0 < one.num_fast_forwarded
    assert r1.by_id().keys() == r10.by_id().keys()
    assert all(r["output_len"] == r10.by_id()[r["id"]]["output_len"] for r in r1.requests)
    ttft1 = statistics.median(r["ttft_ms"] for r in r1.requests)
    ttft10 = statistics.median(r["ttft_ms"] for r in r10.requests)
    assert ttft10 > 1.5 * ttft1  # an arrival waits for the running window (about half of 10 decode steps)
    assert min(r["ttft_ms"] for r in r10.requests) >= 0


def _tiny_code_tokens(*overrides: str) -> dict[str, list[int]]:
    cfg = compose(["model=tiny_code", "max_num_seqs=4", *overrides], logger="none", progress=False)
    stack = build_stack(cfg)
    requests = [Request(f"r{i}", tuple((37 * i + 11 * j) % 500 + 3 for j in range(5 + 7 * i)), 6 + 3 * i, 0.01 * i)
                for i in range(5)]
    run_workload(stack.engine, requests)
    result = collect_results(stack.engine, 1.0)
    assert result.summary["leaked_blocks"] == 0
    return {r["id"]: r["output_token_ids"] for r in result.requests}


def test_real_model_tokens_do_not_change():
    assert _tiny_code_tokens("num_scheduler_steps=4") == _tiny_code_tokens()
