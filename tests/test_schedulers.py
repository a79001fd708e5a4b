"""Scheduling policies on hand-made scenarios (fake executor + virtual clock, no model), the
config checks of the issue's "Bad input", and token equality of every scheduler on the tiny model."""

from __future__ import annotations

import json

import pytest

from conftest import pin_test_defaults
from servelab.api import compose as _compose
from servelab.core.request import Request
from servelab.run.runner import run_workload
from servelab.run.session import collect_results, run_job
from servelab.assemble.stack import build_stack
from servelab.core.errors import ConfigError
from servelab.kit.testing import FakeExecutor, StepTimeModel, VirtualClock

SCHEDULERS = ["fcfs", "static", "priority", "slo_aware", "lpm"]


def compose(overrides, **values):
    return _compose(pin_test_defaults(overrides), **values)


def fake_engine(scheduler: str, *overrides: str, num_kv_blocks: int = 1024, step_time: StepTimeModel | None = None):
    cfg = compose([f"scheduler={scheduler}", *overrides], logger="none")
    clock = VirtualClock()
    executor = FakeExecutor(clock, num_kv_blocks=num_kv_blocks, step_time=step_time)
    return build_stack(cfg, executor=executor, clock=clock).engine, clock


def req(rid: str, prompt_len: int, max_tokens: int, arrival: float = 0.0, **kw) -> Request:
    prompt = tuple((hash(rid) + 7 * i) % 1000 for i in range(prompt_len))
    return Request(rid, prompt, max_tokens, arrival, **kw)


def run(engine, clock, requests):
    run_workload(engine, requests, sleep=clock.sleep)
    result = collect_results(engine, 1.0)
    assert result.summary["leaked_blocks"] == 0
    return result.by_id()


def first_step_of(engine, rid: str) -> int:
    return next(s.step for s in engine.steps if any(i == rid for i, _ in s.scheduled))


def finish_step_of(engine, rid: str) -> int:
    return max(s.step for s in engine.steps if any(i == rid for i, _ in s.scheduled))


# ---- fcfs and the shared loop ---------------------------------------------------------------

def test_fcfs_admits_in_arrival_order_and_refills_seats_at_once():
    engine, clock = fake_engine("fcfs", "max_num_seqs=2")
    run(engine, clock, [req("a", 8, 2), req("b", 8, 10), req("c", 8, 4, arrival=1e-6)])
    assert first_step_of(engine, "a") == first_step_of(engine, "b") == 0
    # continuous batching: c takes a's seat as soon as a finishes, while b still runs
    assert first_step_of(engine, "c") == finish_step_of(engine, "a") + 1 < finish_step_of(engine, "b")


def test_chunked_prefill_schedules_decodes_first_and_fills_the_budget():
    engine, clock = fake_engine("fcfs", "max_num_batched_tokens=32", "max_num_seqs=8")
    run(engine, clock, [req("short", 4, 20), req("long", 100, 2, arrival=0.02)])
    long_steps = [s for s in engine.steps if any(i == "long" for i, _ in s.scheduled)]
    assert all(s.num_tokens <= 32 for s in engine.steps)
    chunks = [dict(s.scheduled)["long"] for s in long_steps]
    assert chunks[:4] == [31, 31, 31, 7]  # one decode + a 31-token chunk per step
    assert all(s.scheduled[0] == ("short", 1) for s in long_steps[:3])


def test_chunked_prefill_off_schedules_a_prompt_whole_or_not_at_all():
    engine, clock = fake_engine("fcfs", "chunked_prefill=false", "max_num_batched_tokens=128", "max_model_len=128")
    run(engine, clock, [req("a", 100, 3), req("b", 100, 3)])
    for s in engine.steps:
        for rid, n in s.scheduled:
            assert n in (1, 100)
    assert first_step_of(engine, "b") == 1  # did not fit next to a's 100 tokens in step 0


# ---- static ---------------------------------------------------------------------------------

def test_static_admits_nobody_until_the_whole_batch_has_finished():
    engine, clock = fake_engine("static", "max_num_seqs=2")
    run(engine, clock, [req("a", 8, 2), req("b", 8, 10), req("c", 8, 4, arrival=1e-6), req("d", 8, 4, arrival=1e-6)])
    assert first_step_of(engine, "c") == first_step_of(engine, "d") == finish_step_of(engine, "b") + 1
    assert max(s.num_seqs for s in engine.steps[finish_step_of(engine, "a") + 1:finish_step_of(engine, "b") + 1]) == 1


def test_static_batch_is_those_waiting_when_it_forms():
    engine, clock = fake_engine("static", "max_num_seqs=4")
    run(engine, clock, [req("a", 8, 6), req("late", 8, 2, arrival=0.001)])
    assert first_step_of(engine, "late") == finish_step_of(engine, "a") + 1


# ---- priority -------------------------------------------------------------------------------

def test_priority_orders_waiting_by_priority_then_arrival():
    engine, clock = fake_engine("priority", "max_num_seqs=1")
    run(engine, clock, [req("p2", 8, 2, priority=2), req("p0", 8, 2, priority=0), req("p1a", 8, 2, priority=1),
                        req("p1b", 8, 2, arrival=1e-6, priority=1)])
    order = sorted(["p2", "p0", "p1a", "p1b"], key=lambda r: first_step_of(engine, r))
    assert order == ["p0", "p1a", "p1b", "p2"]


def test_priority_keeps_arrival_order_among_equals_while_the_head_waits_for_a_seat():
    engine, clock = fake_engine("priority", "max_num_seqs=1")
    run(engine, clock, [req(f"r{i}", 8, 3, priority=1) for i in range(5)])  # identical keys
    assert sorted((f"r{i}" for i in range(5)), key=lambda r: first_step_of(engine, r)) == [f"r{i}" for i in range(5)]


def test_priority_urgent_arrival_preempts_a_less_urgent_running_request_for_its_seat():
    engine, clock = fake_engine("priority", "max_num_seqs=1")
    out = run(engine, clock, [req("low", 8, 20, priority=5), req("urgent", 8, 3, arrival=0.03, priority=0)])
    assert out["low"]["num_preemptions"] == 1 and out["urgent"]["num_preemptions"] == 0
    assert finish_step_of(engine, "urgent") < finish_step_of(engine, "low")
    assert out["low"]["output_len"] == 20


def test_priority_equal_priorities_never_preempt():
    engine, clock = fake_engine("priority", "max_num_seqs=1")
    out = run(engine, clock, [req("first", 8, 20, priority=1), req("second", 8, 3, arrival=0.03, priority=1)])
    assert out["first"]["num_preemptions"] == 0
    assert first_step_of(engine, "second") == finish_step_of(engine, "first") + 1


def test_priority_under_memory_pressure_preempts_the_least_urgent_even_if_older():
    # 6 blocks of 16: both need 3 blocks for 40 tokens, but grow past it -> one is preempted
    engine, clock = fake_engine("priority", num_kv_blocks=6)
    out = run(engine, clock, [req("old_low", 30, 30, priority=3), req("new_high", 30, 30, arrival=1e-6, priority=0)])
    assert out["old_low"]["num_preemptions"] >= 1 and out["new_high"]["num_preemptions"] == 0
    engine, clock = fake_engine("fcfs", num_kv_blocks=6)  # fcfs preempts the newest instead
    out = run(engine, clock, [req("old_low", 30, 30, priority=3), req("new_high", 30, 30, arrival=1e-6, priority=0)])
    assert out["new_high"]["num_preemptions"] >= 1 and out["old_low"]["num_preemptions"] == 0


# ---- slo_aware ------------------------------------------------------------------------------

def test_slo_aware_admits_earliest_ttft_deadline_first():
    engine, clock = fake_engine("slo_aware", "max_num_seqs=1", "slo.ttft_ms=10000")
    run(engine, clock, [req("loose", 8, 2, ttft_slo_ms=5000), req("default", 8, 2),
                        req("tight", 8, 2, ttft_slo_ms=500)])
    order = sorted(["loose", "default", "tight"], key=lambda r: first_step_of(engine, r))
    assert order == ["tight", "loose", "default"]


def test_slo_aware_defers_hopeless_requests_but_still_runs_them():
    # one seat; each request takes ~10 steps x ~6 ms. "doomed" (due at 30 ms) cannot start before
    # "first" ends (~70 ms), so it is passed over for "on_time" (due at 1 s) and runs last.
    engine, clock = fake_engine("slo_aware", "max_num_seqs=1")
    out = run(engine, clock, [req("first", 8, 12, ttft_slo_ms=100), req("doomed", 8, 12, arrival=1e-6, ttft_slo_ms=30),
                              req("on_time", 8, 12, arrival=2e-6, ttft_slo_ms=1000)])
    assert first_step_of(engine, "on_time") < first_step_of(engine, "doomed")
    assert out["doomed"]["output_len"] == 12 and out["doomed"]["met_slo"] is False
    assert out["on_time"]["met_slo"] and out["first"]["met_slo"]
    engine, clock = fake_engine("fcfs", "max_num_seqs=1")  # fcfs serves doomed first: both miss
    out = run(engine, clock, [req("first", 8, 12, ttft_slo_ms=100), req("doomed", 8, 12, arrival=1e-6, ttft_slo_ms=30),
                              req("on_time", 8, 12, arrival=2e-6, ttft_slo_ms=1000)])
    assert out["first"]["met_slo"] and not out["doomed"]["met_slo"]


def _decodes_then_long_prompt(scheduler: str):
    step = StepTimeModel(base_s=0.002, per_token_s=0.0002, per_seq_s=0.0003)
    engine, clock = fake_engine(scheduler, "slo.tpot_ms=20", step_time=step)
    # warm the cost model with a few decodes, then a 600-token prompt arrives
    requests = [req(f"d{i}", 16, 60) for i in range(4)] + [req("long", 600, 4, arrival=0.1)]
    return run(engine, clock, requests), engine


def test_slo_aware_caps_prefill_so_running_requests_keep_their_tpot():
    out, engine = _decodes_then_long_prompt("slo_aware")
    assert all(out[f"d{i}"]["met_tpot_slo"] for i in range(4))
    long_chunks = [dict(s.scheduled)["long"] for s in engine.steps if "long" in dict(s.scheduled)]
    assert len(long_chunks) > 3 and max(long_chunks) < 600  # chunked into TPOT-sized pieces
    assert out["long"]["output_len"] == 4
    out, _ = _decodes_then_long_prompt("fcfs")  # fcfs takes the whole prompt in one step
    assert max(max(out[f"d{i}"]["itl_ms"]) for i in range(4)) > 20


def test_slo_aware_admission_keeps_decode_steps_within_the_tpot_target():
    step = StepTimeModel(base_s=0.002, per_token_s=0.0002, per_seq_s=0.001)  # ~1.2 ms per decode
    engine, clock = fake_engine("slo_aware", "slo.tpot_ms=12", step_time=step)
    out = run(engine, clock, [req(f"r{i}", 8, 40) for i in range(24)])
    calibrated = engine.steps[45:]  # the first wave was admitted on the cost model's prior
    # 2 ms + 4 x 1.2 ms ~ (1 - prefill_share 0.3) x margin 0.9 x 12 ms; the fit may round either way
    assert max(s.decode_seqs for s in calibrated) in (4, 5)
    assert sum(r["met_tpot_slo"] for r in out.values()) >= 12
    engine, clock = fake_engine("fcfs", "slo.tpot_ms=12", step_time=step)
    out = run(engine, clock, [req(f"r{i}", 8, 40) for i in range(24)])
    assert sum(r["met_tpot_slo"] for r in out.values()) == 0  # all 24 decode together: ~31 ms steps


def test_a_request_whose_slo_cannot_be_met_alone_still_runs_and_counts_as_a_miss():
    engine, clock = fake_engine("slo_aware")
    out = run(engine, clock, [req("impossible", 64, 8, ttft_slo_ms=0.01, tpot_slo_ms=0.01)])
    assert out["impossible"]["output_len"] == 8 and out["impossible"]["met_slo"] is False
    assert collect_results(engine, 1.0).summary["slo_attainment"] == 0.0


def test_cost_model_learns_the_fake_step_time():
    step = StepTimeModel(base_s=0.004, per_token_s=0.0003, per_seq_s=0.0)
    engine, clock = fake_engine("fcfs", "max_num_batched_tokens=64", "max_num_seqs=16", step_time=step)
    run(engine, clock, [req(f"r{i}", int(20 + 13 * i), 10, arrival=0.01 * i) for i in range(12)])
    coef = engine.cost_model.coefficients
    assert coef["base_s"] == pytest.approx(0.004, rel=0.2)
    assert coef["per_prefill_token_s"] == pytest.approx(0.0003, rel=0.2)


# ---- outputs, logs, bad input ---------------------------------------------------------------

@pytest.mark.parametrize("scheduler", SCHEDULERS)
@pytest.mark.parametrize("chunked", [True, False])
def test_every_scheduler_gives_the_same_tokens_under_pressure(scheduler, chunked):
    overrides = ["max_num_seqs=4", "max_model_len=256", "slo.ttft_ms=50", "slo.tpot_ms=5",
                 f"chunked_prefill={str(chunked).lower()}", f"max_num_batched_tokens={64 if chunked else 256}"]
    requests = [req(f"r{i}", 10 + 17 * i % 90, 5 + 7 * i % 30, arrival=0.003 * i, priority=i % 3) for i in range(16)]
    engine, clock = fake_engine(scheduler, *overrides, num_kv_blocks=14)
    out = run(engine, clock, requests)
    engine, clock = fake_engine("fcfs", num_kv_blocks=1024)
    ref = run(engine, clock, requests)
    assert {k: v["output_token_ids"] for k, v in out.items()} == {k: v["output_token_ids"] for k, v in ref.items()}


def test_steps_jsonl_records_the_plan_and_the_schedulers_numbers(tmp_path):
    cfg = compose(["scheduler=slo_aware", "debug.log_steps=true", "slo.tpot_ms=50"], logger="none", progress=False)
    clock = VirtualClock()
    stack = build_stack(cfg, executor=FakeExecutor(clock, num_kv_blocks=64), clock=clock)
    run_job(cfg, tmp_path, requests=[req("a", 20, 3), req("b", 20, 3)], stack=stack)
    steps = [json.loads(line) for line in (tmp_path / "steps.jsonl").read_text().splitlines()]
    assert steps[0]["scheduled"] == [["a", 20], ["b", 20]]
    assert {"prefill_cap", "step_limit_ms", "late"} <= set(steps[-1]["scheduler"])


@pytest.mark.parametrize("override, key", [
    ("max_num_seqs=0", "max_num_seqs"),
    ("max_num_batched_tokens=8", "max_num_batched_tokens"),  # < block_size 16
    ("max_num_batched_tokens=32", "max_num_batched_tokens"),  # < max_num_seqs 64
    ("slo.ttft_ms=0", "slo.ttft_ms"),
    ("slo.tpot_ms=-5", "slo.tpot_ms"),
])
def test_bad_limits_are_rejected_naming_the_key(override, key):
    cfg = compose([override], logger="none")
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        build_stack(cfg, executor=FakeExecutor(VirtualClock(), num_kv_blocks=8))


@pytest.mark.parametrize("override", ["scheduler.margin=0", "scheduler.prefill_share=1", "scheduler.max_step_tpots=0.5"])
def test_slo_aware_parameters_out_of_range_are_rejected(override):
    cfg = compose(["scheduler=slo_aware", override], logger="none")
    with pytest.raises(ConfigError, match=override.split("=")[0].replace(".", r"\.")):
        build_stack(cfg, executor=FakeExecutor(VirtualClock(), num_kv_blocks=8))


@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_slo_aware_config_is_type_checked_and_every_scheduler_is_selectable(scheduler):
    assert compose([f"scheduler={scheduler}"], logger="none").scheduler.name == scheduler
    with pytest.raises(Exception, match="margin"):
        compose(["scheduler=slo_aware", "scheduler.margin=abc"], logger="none")


# ---- the tiny real model --------------------------------------------------------------------

TINY = ["model.hidden_size=64", "model.intermediate_size=128", "model.num_hidden_layers=2",
        "model.num_attention_heads=4", "model.num_key_value_heads=2", "model.vocab_size=512",
        "max_model_len=256", "backend.num_threads=1"]


def _real_outputs(*overrides: str) -> dict[str, list[int]]:
    cfg = compose([*TINY, *overrides], logger="none")
    stack = build_stack(cfg)
    requests = [req(f"r{i}", 6 + 23 * i % 120, 4 + 5 * i % 24, arrival=0.002 * i, priority=i % 3,
                    ttft_slo_ms=None if i % 2 else 20.0) for i in range(12)]
    requests = [Request(r.id, tuple(t % 512 for t in r.prompt_token_ids), r.max_tokens, r.arrival_time,
                        priority=r.priority, ttft_slo_ms=r.ttft_slo_ms) for r in requests]
    run_workload(stack.engine, requests)
    result = collect_results(stack.engine, 1.0)
    assert result.summary["leaked_blocks"] == 0 and result.summary["num_finished"] == 12
    return {r["id"]: r["output_token_ids"] for r in result.requests}


@pytest.fixture(scope="module")
def default_outputs():
    return _real_outputs()


@pytest.mark.parametrize("chunked", [True, False])
@pytest.mark.parametrize("scheduler", SCHEDULERS)
def test_real_model_tokens_match_the_default_stack(default_outputs, scheduler, chunked):
    # a small pool (preemptions) and, with chunking on, a small budget (prompts split)
    outputs = _real_outputs(f"scheduler={scheduler}", f"chunked_prefill={str(chunked).lower()}",
                            f"max_num_batched_tokens={48 if chunked else 256}", "max_num_seqs=6",
                            "num_kv_blocks=12", "slo.tpot_ms=5")
    assert outputs == default_outputs
