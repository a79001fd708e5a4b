"""The simulator's MoE pricing: routing drawn per token (skew) or replayed, the experts a step touches
priced, expert parallelism's all-to-all, deterministic, dense models untouched (servelab.sim.moe_pricer)."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from conftest import REPO, compose
from servelab.assemble.stack import build_stack
from servelab.core.errors import ConfigError
from servelab.core.step_work import StepWork
from servelab.sim.moe_routing import EXACT_TOKENS, ExpertRouting


def decode(batch: int, context: int = 512) -> StepWork:
    return StepWork(num_tokens=batch, num_seqs=batch, decode_seqs=batch, num_sampled=batch,
                    attended=batch * context, context_tokens=batch * context)


def time_model(*overrides):
    return build_stack(compose("backend=sim", "model=qwen3_30b_a3b", *overrides)).time_model


def touched(routing: ExpertRouting, n: int, steps: int = 20) -> float:
    return float(np.mean([(routing.counts(n) > 0).sum(axis=1).mean() for _ in range(steps)]))


def test_a_token_touches_exactly_top_k_experts_and_every_token_is_counted_k_times():
    r = ExpertRouting(128, 8, 4, skew=1.0, seed=3)
    one = r.counts(1)
    assert one.shape == (4, 128) and (one.sum(axis=1) == 8).all() and (one.max(axis=1) == 1).all()
    big = r.counts(EXACT_TOKENS * 8)  # the multinomial path
    assert (big.sum(axis=1) == EXACT_TOKENS * 8 * 8).all()


def test_skew_concentrates_the_routing_on_fewer_experts():
    uniform, skewed = ExpertRouting(128, 8, 4, skew=0.0), ExpertRouting(128, 8, 4, skew=1.5)
    assert touched(uniform, 16) > touched(skewed, 16) + 20  # 16 tokens x 8: ~81 of 128 uniform, far fewer skewed
    assert touched(uniform, 16) == pytest.approx(128 * (1 - (1 - 8 / 128) ** 16), rel=0.05)


def test_routing_is_deterministic_per_seed():
    a, b, c = (ExpertRouting(64, 4, 3, skew=1.0, seed=s) for s in (7, 7, 8))
    draws_a = [a.counts(n) for n in (1, 5, 200)]
    assert all((x == b.counts(n)).all() for x, n in zip(draws_a, (1, 5, 200)))
    assert any((x != c.counts(n)).any() for x, n in zip(draws_a, (1, 5, 200)))


def test_a_routing_trace_is_replayed_token_by_token(tmp_path):
    path = tmp_path / "trace.npy"
    np.save(path, np.array([[0, 1], [0, 2], [3, 1]]))
    r = ExpertRouting(4, 2, 2, trace=str(path))
    assert r.counts(2).tolist() == [[2, 1, 1, 0]] * 2
    assert r.counts(2).tolist() == [[1, 2, 0, 1]] * 2  # token 3, then wraps round to token 1
    (tmp_path / "bad.json").write_text(json.dumps([[0, 9]]))
    with pytest.raises(ConfigError, match=r"sim.moe.routing_trace=.*bad.json.*expert ids must lie in \[0, 4\)"):
        ExpertRouting(4, 2, 2, trace=str(tmp_path / "bad.json"))
    with pytest.raises(ConfigError, match=r"shape \[tokens, 2\] or \[tokens, 2, 2\]"):
        np.save(tmp_path / "k3.npy", np.zeros((5, 3), dtype=int))
        ExpertRouting(4, 2, 2, trace=str(tmp_path / "k3.npy"))


@pytest.mark.parametrize("name", ["roofline", "calibrated_roofline"])
def test_expert_cost_grows_with_the_experts_touched(name):
    tm = time_model(f"time_model={name}")
    moe = tm._moe if name == "roofline" else tm.pricer.moe
    counts = np.zeros((moe.routing.num_layers, 128), dtype=int)
    prices = []
    for spread in (8, 16, 64, 128):  # the same 128 token-expert pairs over more experts
        counts[:] = 0
        counts[:, :spread] = 128 // spread
        prices.append(moe._parts(counts)[0])
    assert prices == sorted(prices) and prices[-1] > 4 * prices[0]


def test_a_decode_step_reads_only_the_experts_it_touches():
    # before: roofline read all 128 experts of every layer (24.6 ms for one sequence on H100, docs/simulator.md)
    one = time_model("time_model=roofline").predict(decode(1))
    assert one < 8e-3
    batch = time_model("time_model=roofline").predict(decode(64))
    assert batch > 2 * one  # 64 sequences touch most experts


def test_high_skew_makes_a_decode_batch_cheaper():
    uniform = [time_model("sim.moe.routing_skew=0").predict(decode(32)) for _ in range(3)]
    skewed = [time_model("sim.moe.routing_skew=2.0").predict(decode(32)) for _ in range(3)]
    assert max(skewed) < min(uniform)


def test_all_to_all_appears_only_with_expert_parallelism():
    tp2 = time_model("tensor_parallel_size=2").breakdown(decode(8))
    ep2 = time_model("tensor_parallel_size=2", "expert_parallel_size=2").breakdown(decode(8))
    assert tp2["all_to_all"] == 0.0 and tp2["experts"] > 0
    assert ep2["all_to_all"] > 0
    assert ep2["communication"] < tp2["communication"]  # the MoE layers' all-reduce became the combine
    dense = build_stack(compose("backend=sim", "model=llama3_8b")).time_model.breakdown(decode(8))
    assert "experts" not in dense and "all_to_all" not in dense


def test_expert_parallel_runs_show_imbalance_under_skew():
    def imbalance(skew):
        tm = time_model("tensor_parallel_size=4", "expert_parallel_size=4", f"sim.moe.routing_skew={skew}")
        for _ in range(10):
            tm.predict(decode(16))
        return tm.timing_summary()["moe_mean_group_imbalance"]

    assert imbalance(1.5) > imbalance(0.0) > 1.0


def test_the_same_steps_are_priced_the_same():
    steps = [decode(b) for b in (1, 4, 300, 17)]
    a = [time_model("sim.moe.routing_skew=1").predict(w) for w in steps]
    b = [time_model("sim.moe.routing_skew=1").predict(w) for w in steps]
    assert a == b


def test_a_moe_preset_runs_from_the_command_line_with_the_pricing_in_the_banner():
    proc = subprocess.run([sys.executable, str(REPO / "run.py"), "backend=sim", "model=qwen3_30b_a3b", "logger=none",
                           "workload.num_requests=4", "tensor_parallel_size=2", "expert_parallel_size=2",
                           "sim.moe.routing_skew=1.0"], capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-2000:]
    row = next(line for line in proc.stdout.splitlines() if line.strip().startswith("MoE"))
    assert "48 layers x 128 experts top-8" in row and "Zipf skew 1" in row and "EP 2 all-to-all" in row


def test_the_all_to_all_rule_reproduces_deepeps_held_out_low_latency_rows():
    """Validation only (the rule is the normal kernels' bandwidth + the link's latency floor): DeepEP's
    low-latency EP 8 row, 128 tokens per rank x 8 ranks, hidden 7168, top-8, FP8 dispatch / BF16 combine,
    77 us / 114 us on H800 (README), priced on an H800-like sheet (NVLink 200 GB/s per direction)."""
    from servelab.core.shapes import HardwareProfile
    from servelab.sim.moe_pricer import ALL_TO_ALL_FILE, AllToAll

    h800 = HardwareProfile("h800", 80, 3350, 989, link_bandwidth_gb_s=200, host_link_gb_s=64, link_latency_us=35)
    a2a = AllToAll.for_hardware(h800, 8)
    received = 128 * 8 * 8 / 8  # a rank receives its share of every rank's token copies
    dispatch, combine = a2a.dispatch_combine(received, 7168 * 1, 7168 * 2)
    rows = {r["ep"]: r for r in json.loads(ALL_TO_ALL_FILE.read_text())["low_latency"]}
    assert float(dispatch) * 1e6 == pytest.approx(rows[8]["dispatch_us"], rel=0.1)
    assert float(combine) * 1e6 == pytest.approx(rows[8]["combine_us"], rel=0.1)


def test_ep_exchange_all_reduce_prices_the_real_engines_ep_without_an_all_to_all():
    tp2 = time_model("tensor_parallel_size=2").breakdown(decode(8))
    ar = time_model("tensor_parallel_size=2", "expert_parallel_size=2", "sim.moe.ep_exchange=all_reduce")
    assert ar.breakdown(decode(8))["all_to_all"] == 0.0
    assert ar.breakdown(decode(8))["communication"] == tp2["communication"]
    assert "sim.moe.ep_exchange=all_reduce" in ar.moe_label
    with pytest.raises(ConfigError, match="sim.moe.ep_exchange='nope': choose one of all_to_all, all_reduce"):
        time_model("tensor_parallel_size=2", "expert_parallel_size=2", "sim.moe.ep_exchange=nope")


def test_an_overlapping_engine_preset_overlaps_the_experts_with_the_host():
    tm = time_model("engine=vllm_v1", "engine.overlap=true")
    parts = tm.breakdown(decode(64))
    gpu = sum(v for k, v in parts.items() if k != "host")
    assert parts["experts"] > 0
    assert tm.predict(decode(64)) == pytest.approx(gpu + parts["host"], rel=0.2)  # its own draw, same law


def test_a_negative_skew_is_refused_naming_the_key():
    with pytest.raises(ConfigError, match=r"sim.moe.routing_skew=-1.0 must be >= 0"):
        time_model("sim.moe.routing_skew=-1")
