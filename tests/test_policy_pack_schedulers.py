"""Policy pack I: vtc (virtual token counters), mlfq (skip-join levels, demotion, preemption at
quantum boundaries) and sjf (predicted remaining output) on hand-made scenarios (fake executor,
virtual clock), their bad-input lines, and token equality with fcfs on the tiny real model."""

from __future__ import annotations

import pytest

from test_schedulers import _real_outputs, default_outputs, fake_engine, first_step_of, req, run  # noqa: F401
from servelab.core.errors import ConfigError
from servelab.core.request import Sequence


def admission_order(engine) -> list[str]:
    """Request ids in the order they first got a step."""
    order: list[str] = []
    for step in engine.steps:
        order += [rid for rid, _ in step.scheduled if rid not in order]
    return order


# ---- vtc ------------------------------------------------------------------------------------

def test_vtc_counters_charge_weighted_prompt_and_output_tokens():
    engine, clock = fake_engine("vtc", "scheduler.input_weight=1", "scheduler.output_weight=2")
    requests = [req("a0", 10, 5, client_id="a"), req("a1", 7, 3, client_id="a"), req("b0", 4, 9, client_id="b")]
    run(engine, clock, requests)
    assert engine.scheduler.counters == {"a": 10 + 7 + 2 * (5 + 3), "b": 4 + 2 * 9}


def test_vtc_admits_the_backlogged_client_with_the_smallest_counter():
    # one seat: fcfs serves the flood first; vtc alternates between the two clients
    flood = [req(f"f{i}", 8, 4, arrival=0.0, client_id="flood") for i in range(6)]
    steady = [req(f"s{i}", 8, 4, arrival=1e-6, client_id="steady") for i in range(3)]
    engine, clock = fake_engine("fcfs", "max_num_seqs=1")
    run(engine, clock, flood + steady)
    assert admission_order(engine) == [*(r.id for r in flood), *(r.id for r in steady)]
    engine, clock = fake_engine("vtc", "max_num_seqs=1")
    run(engine, clock, flood + steady)
    assert admission_order(engine)[:7] == ["f0", "s0", "f1", "s1", "f2", "s2", "f3"]


def test_vtc_lifts_the_counter_of_a_client_that_becomes_backlogged():
    engine, clock = fake_engine("vtc", "max_num_seqs=1")
    for i in range(4):
        engine.add_request(req(f"f{i}", 8, 4, client_id="flood"))
    while engine.scheduler.counters["flood"] < 40:  # flood is served alone for a while
        engine.step()
    flood_counter = engine.scheduler.counters["flood"]
    engine.add_request(req("late0", 8, 4, arrival=clock.now(), client_id="late"), arrival_s=clock.now())
    # no credit for the time away: it starts level with the backlogged client, not at 0
    assert engine.scheduler.counters["late"] == flood_counter
    engine.add_request(req("late1", 8, 4, arrival=clock.now(), client_id="late"), arrival_s=clock.now())
    assert engine.scheduler.counters["late"] == flood_counter  # already backlogged: no second lift
    while engine.has_unfinished():
        engine.step()
    order = admission_order(engine)
    assert order.index("late1") > order.index("f3") or order.index("late1") > order.index("late0") + 1


def test_vtc_lift_when_nobody_is_backlogged_uses_the_client_admitted_last():
    engine, clock = fake_engine("vtc")
    engine.add_request(req("a0", 20, 2, client_id="a"))
    while engine.has_unfinished():
        engine.step()
    engine.add_request(req("b0", 5, 2, arrival=clock.now(), client_id="b"), arrival_s=clock.now())
    assert engine.scheduler.counters["b"] == engine.scheduler.counters["a"] == 20 + 2 * 2


def test_vtc_requests_without_a_client_share_one_and_state_is_dropped():
    engine, clock = fake_engine("vtc", "max_num_seqs=2", num_kv_blocks=6)
    out = run(engine, clock, [req(f"r{i}", 20, 12, arrival=0.001 * i) for i in range(6)])
    assert all(r["finish_reason"] == "length" for r in out.values())
    assert set(engine.scheduler.counters) == {""}
    assert engine.scheduler._charged_outputs == {}


@pytest.mark.parametrize("key,value", [("input_weight", 0), ("output_weight", -1)])
def test_vtc_weights_must_be_positive(key, value):
    with pytest.raises(ConfigError, match=f"scheduler.{key}={float(value)} must be > 0"):
        fake_engine("vtc", f"scheduler.{key}={value}")


# ---- mlfq -----------------------------------------------------------------------------------

def test_mlfq_skip_join_puts_a_prompt_on_the_level_its_prefill_cost_implies():
    engine, _ = fake_engine("mlfq", "scheduler.quanta=[4,16,64]")
    sched = engine.scheduler
    # before any step the cost model's prior prices a prompt token like one decode iteration
    levels = [sched.join_level(Sequence(req(f"p{n}", n, 4))) for n in (3, 4, 10, 50, 500)]
    assert levels == [0, 0, 1, 2, 2]
    engine, _ = fake_engine("mlfq", "scheduler.quanta=[4,16,64]", "scheduler.skip_join=false")
    assert engine.scheduler.join_level(Sequence(req("p", 500, 4))) == 0


def test_mlfq_demotes_a_request_each_time_it_uses_up_its_quantum():
    engine, clock = fake_engine("mlfq", "scheduler.quanta=[4,16,64]")
    levels: dict[int, int] = {}
    engine.step_listeners.append(lambda record: levels.setdefault(
        engine.sequences["long"].num_output_tokens, engine.scheduler.level.get("long", -1)))
    run(engine, clock, [req("long", 2, 40)])
    # level seen after each step, by output tokens so far (demotion shows at the next schedule)
    assert levels[1] == levels[4] == 0 and levels[5] == 1 and levels[20] == 1 and levels[21] == 2


def test_mlfq_preempts_a_demoted_request_at_its_quantum_boundary_for_a_new_one():
    requests = [req("long", 2, 60), req("short", 2, 3, arrival=0.05)]
    engine, clock = fake_engine("fcfs", "max_num_seqs=1")
    out = run(engine, clock, requests)
    assert out["short"]["queue_ms"] >= out["long"]["e2e_ms"] - 50  # it arrived at 50 ms and waited for long
    engine, clock = fake_engine("mlfq", "max_num_seqs=1", "scheduler.quanta=[4,16,64]")
    out = run(engine, clock, requests)
    assert out["long"]["num_preemptions"] == 1 and out["short"]["num_preemptions"] == 0
    assert out["short"]["e2e_ms"] + 50 < out["long"]["e2e_ms"]


def test_mlfq_promotes_a_request_that_waited_max_wait_s():
    requests = [req("long-prompt", 60, 4)] + [req(f"s{i}", 2, 6, arrival=0.001 * i) for i in range(30)]
    engine, clock = fake_engine("mlfq", "max_num_seqs=1", "scheduler.quanta=[4,16,64]")
    run(engine, clock, requests)
    assert admission_order(engine)[-1] == "long-prompt"  # skip-join put it below every short one
    engine, clock = fake_engine("mlfq", "max_num_seqs=1", "scheduler.quanta=[4,16,64]", "scheduler.max_wait_s=0.05")
    out = run(engine, clock, requests)
    assert admission_order(engine).index("long-prompt") < 20
    assert engine.scheduler.level == {} and engine.scheduler._waiting_since == {}
    assert all(r["finish_reason"] == "length" for r in out.values())


@pytest.mark.parametrize("quanta", ["[4,4,8]", "[8,4]", "[]", "[0,4]"])
def test_mlfq_quanta_must_increase(quanta):
    with pytest.raises(ConfigError, match="scheduler.quanta=.* strictly increasing"):
        fake_engine("mlfq", f"scheduler.quanta={quanta}")


# ---- sjf ------------------------------------------------------------------------------------

def test_sjf_admits_the_shortest_predicted_output_first():
    requests = [req("long", 8, 30), req("short", 8, 5), req("mid", 8, 15), req("tiny", 8, 2, arrival=0.01)]
    engine, clock = fake_engine("sjf", "length_predictor=oracle", "max_num_seqs=1")
    run(engine, clock, requests)
    assert admission_order(engine) == ["short", "tiny", "mid", "long"]


def test_sjf_aging_bound_admits_a_long_request_that_waited_max_wait_s():
    requests = [req("long", 8, 40)] + [req(f"s{i}", 8, 3, arrival=0.001 * i) for i in range(40)]
    engine, clock = fake_engine("sjf", "length_predictor=oracle", "max_num_seqs=1")
    run(engine, clock, requests)
    assert admission_order(engine)[-1] == "long"
    engine, clock = fake_engine("sjf", "length_predictor=oracle", "max_num_seqs=1", "scheduler.max_wait_s=0.05")
    run(engine, clock, requests)
    assert admission_order(engine).index("long") < 25


def test_sjf_preemptive_takes_the_seat_of_a_much_longer_request():
    requests = [req("long", 2, 80), req("short", 2, 4, arrival=0.02)]
    engine, clock = fake_engine("sjf", "length_predictor=oracle", "max_num_seqs=1", "scheduler.preemptive=true")
    out = run(engine, clock, requests)
    assert out["long"]["num_preemptions"] == 1 and out["short"]["e2e_ms"] < 100
    engine, clock = fake_engine("sjf", "length_predictor=oracle", "max_num_seqs=1")
    out = run(engine, clock, requests)
    assert out["long"]["num_preemptions"] == 0


def test_sjf_refuses_to_start_without_a_predictor():
    with pytest.raises(ConfigError, match="scheduler=sjf .* length_predictor=none"):
        fake_engine("sjf")


# ---- a policy never changes what the model computes -----------------------------------------

@pytest.mark.parametrize("stack", [("scheduler=vtc",), ("scheduler=mlfq", "preemption=swap"),
                                   ("scheduler=mlfq", "scheduler.quanta=[2,4,8]"),
                                   ("scheduler=sjf", "length_predictor=oracle", "scheduler.preemptive=true",
                                    "scheduler.preempt_margin=0")])
def test_real_model_tokens_match_fcfs(default_outputs, stack):  # noqa: F811 - the imported fixture
    outputs = _real_outputs(*stack, "max_num_batched_tokens=48", "max_num_seqs=6", "num_kv_blocks=12")
    assert outputs == default_outputs
