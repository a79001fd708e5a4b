"""Pipeline parallelism on the simulator (``pipeline_parallel_size``, issue 46): the stages' memory, the
micro-batches a step is dealt into, a round's price (serial stages, transfers, bubbles), every scheduler,
allocator and cluster option, MoE with EP inside a stage, and the layouts refused in one line."""

from __future__ import annotations

import dataclasses
import tempfile

import pytest

from servelab.api import compose
from servelab.assemble.executor import executor_context
from servelab.assemble.stack import build_stack
from servelab.assemble.validate import validate
from servelab.core.errors import ConfigError
from servelab.core.registry import default_registry
from servelab.core.step_work import StepWork
from servelab.run.session import run_job
from servelab.sim.pipeline import split_work

SIM = ("backend=sim", "logger=none", "progress=false", "workload=synthetic")
LLAMA = SIM + ("model=llama3_70b", "hardware=h100")


def _summary(*overrides: str) -> dict:
    with tempfile.TemporaryDirectory() as out:
        return run_job(compose(list(overrides)), out).summary


def _time_model(*overrides: str):
    return build_stack(compose(list(LLAMA + overrides))).time_model


def decode(seqs: int, context: int = 1000) -> StepWork:
    return StepWork(num_tokens=seqs, num_seqs=seqs, decode_seqs=seqs, num_sampled=seqs, attended=seqs * context,
                    context_tokens=seqs * context)


def test_split_work_keeps_every_token_and_a_chunk_whole():
    work = StepWork(num_tokens=7 + 512, num_seqs=8, prefill_tokens=512, decode_seqs=7, num_sampled=8,
                    attended=9_000, context_tokens=8_000)
    parts = split_work(work, 2)
    assert [p.decode_seqs for p in parts] == [4, 3]
    assert [p.num_tokens for p in parts] == [4, 3 + 512]  # the chunk whole, on the micro-batch with fewer decodes
    for field in ("num_tokens", "num_seqs", "decode_seqs", "prefill_tokens"):
        assert sum(getattr(p, field) for p in parts) == getattr(work, field)
    assert split_work(decode(5), 3)[2] == decode(1)


def test_stages_hold_their_layers_weights_and_kv():
    tp8, tp4, pp2 = (executor_context(compose(list(LLAMA + o))).memory for o in (
        ("tensor_parallel_size=8",), ("tensor_parallel_size=4",),
        ("tensor_parallel_size=4", "pipeline_parallel_size=2")))
    assert pp2.weight_bytes == pytest.approx(tp4.weight_bytes / 2, rel=0.02)  # half the layers per rank
    assert pp2.bytes_per_block == tp4.bytes_per_block / 2  # KV of its 40 layers only
    assert pp2.num_blocks > 2.5 * tp4.num_blocks  # the freed weights become pool
    assert pp2.num_blocks == pytest.approx(tp8.num_blocks, rel=0.01)  # same GPUs, same bytes per rank
    uneven = executor_context(compose(list(LLAMA + ("tensor_parallel_size=8", "pipeline_parallel_size=3")))).memory
    assert uneven.num_blocks > 0  # 80 layers over 3 stages: 27/27/26, the pool the fullest stage allows


def test_one_stage_leaves_the_pricing_as_it_was():
    one, default = _time_model("tensor_parallel_size=4", "pipeline_parallel_size=1"), _time_model("tensor_parallel_size=4")
    assert one.chosen.pricer.pipeline is None and one.pipeline_label is None
    for work in (decode(1), decode(64), StepWork(num_tokens=300, num_seqs=3, prefill_tokens=298, decode_seqs=2,
                                                 num_sampled=3, attended=40_000, context_tokens=2_300)):
        assert one.predict(work) == default.predict(work)
    assert "pipeline_stages" not in one.timing_summary()


def test_single_request_decode_is_slower_than_tp_on_the_same_gpus_and_load_is_comparable():
    tp8, pp2 = _time_model("tensor_parallel_size=8"), _time_model("tensor_parallel_size=4", "pipeline_parallel_size=2")
    tp4 = _time_model("tensor_parallel_size=4")
    lone = decode(1)
    assert pp2.predict(lone) > tp4.predict(lone) > tp8.predict(lone)  # serial stages at TP 4, plus the transfer
    busy = decode(128)
    assert 0.6 < tp8.predict(busy) / pp2.predict(busy) <= 1.0  # two micro-batches of 64 fill both stages


def test_an_uneven_round_is_paced_by_its_heavy_micro_batch():
    pp2 = _time_model("tensor_parallel_size=4", "pipeline_parallel_size=2")
    books = pp2.chosen.pricer.pipeline
    even = pp2.predict(decode(64))
    even_bubble = 1 - books.busy / books.span
    chunk = StepWork(num_tokens=64 + 2048, num_seqs=65, prefill_tokens=2048, decode_seqs=64, num_sampled=65,
                     attended=64_000 + 2048 * 2049 // 2, context_tokens=64_000 + 2048)
    books.busy = books.span = 0.0
    heavy = pp2.predict(chunk)
    assert heavy > even and 1 - books.busy / books.span > even_bubble + 0.2  # the decode micro-batch waits
    parts = pp2.breakdown(chunk)
    assert sum(parts.values()) == pytest.approx(heavy) and parts["pipeline_wait"] > 0


def test_stages_on_two_nodes_pay_the_network_for_the_activations():
    intra = _time_model("tensor_parallel_size=4", "pipeline_parallel_size=2")
    inter = _time_model("tensor_parallel_size=4", "pipeline_parallel_size=2", "cluster.gpus_per_node=4")
    assert inter.chosen.pricer.pipeline.layout.inter_node_hops == 1
    assert "network" in inter.pipeline_label and "NVLink" in intra.pipeline_label
    for work in (decode(1), decode(256)):
        assert inter.predict(work) > intra.predict(work)


def test_a_dense_and_a_moe_model_run_in_stages_with_the_summary_stating_them():
    dense = _summary(*LLAMA, "tensor_parallel_size=4", "pipeline_parallel_size=2", "workload.num_requests=30")
    assert dense["num_finished"] == 30 and dense["pipeline_stages"] == 2 and dense["pipeline_stage_layers"] == [40, 40]
    assert 0 < dense["pipeline_bubble_share"] < 1 and dense["pipeline_transfer_s"] > 0
    moe = _summary(*SIM, "model=qwen3_30b_a3b", "hardware=h100", "tensor_parallel_size=2", "expert_parallel_size=2",
                   "pipeline_parallel_size=2", "workload.num_requests=30")
    assert moe["num_finished"] == 30 and moe["pipeline_stages"] == 2 and moe["moe_priced_steps"] > 0


def _policy_overrides(kind: str, name: str) -> list[str]:
    cls = default_registry().get(kind, name)
    return [f"{kind}={name}"] + (["length_predictor=oracle"] if getattr(cls, "needs_length_predictor", False) else [])


@pytest.mark.parametrize("kind, name", [("scheduler", n) for n in default_registry().names("scheduler")]
                         + [("allocator", n) for n in default_registry().names("allocator")])
def test_every_scheduler_and_allocator_runs_in_stages(kind, name):
    s = _summary(*SIM, "model=tiny", "pipeline_parallel_size=2", "workload.num_requests=12", "num_kv_blocks=40",
                 *_policy_overrides(kind, name))
    assert s["num_finished"] == 12 and s["pipeline_stages"] == 2


def test_replicas_run_in_stages():
    s = _summary(*LLAMA, "tensor_parallel_size=4", "pipeline_parallel_size=2", "cluster.replicas=2",
                 "workload.num_requests=20")
    assert s["num_finished"] == 20


@pytest.mark.parametrize("overrides, message", [
    (("model=tiny", "pipeline_parallel_size=5"), "pipeline_parallel_size=5 exceeds the model's 4 layers"),
    (("model=tiny", "pipeline_parallel_size=0"), "pipeline_parallel_size=0 must be >= 1"),
])
def test_bad_stage_counts_are_one_line(overrides, message):
    with pytest.raises(ConfigError, match=message):
        executor_context(compose(list(SIM + overrides)))


@pytest.mark.parametrize("overrides, message", [
    (("time_model=roofline",), "pipeline_parallel_size=2 with time_model=roofline: the stages"),
    (("model=qwen3_30b_a3b", "tensor_parallel_size=2", "expert_parallel_size=2", "data_parallel_attention=true"),
     "data_parallel_attention=true with pipeline_parallel_size=2: not priced"),
])
def test_what_the_pipeline_pricing_does_not_cover_is_one_line(overrides, message):
    cfg = compose(list(SIM + ("model=tiny", "pipeline_parallel_size=2") + overrides))
    with pytest.raises(ConfigError, match=message):
        validate(cfg)
    assert "\n" not in message


def test_the_time_model_context_carries_the_stages():
    from servelab.assemble.stack import time_model_context

    cfg = compose(list(LLAMA + ("tensor_parallel_size=4", "pipeline_parallel_size=2")))
    stack = build_stack(cfg)
    ctx = time_model_context(cfg, stack.executor)
    assert ctx.pipeline_parallel_size == 2 and ctx.gpus_per_node == 8
    one = time_model_context(compose(list(LLAMA + ("tensor_parallel_size=4",))), stack.executor)
    assert one == dataclasses.replace(ctx, pipeline_parallel_size=1)


@pytest.mark.parametrize("overrides", [
    LLAMA + ("tensor_parallel_size=4", "pipeline_parallel_size=2", "workload.num_requests=40", "workload.rate=10"),
    LLAMA + ("tensor_parallel_size=2", "pipeline_parallel_size=4", "workload.num_requests=40", "workload.rate=10",
             "cluster.replicas=2"),
    SIM + ("model=qwen3_30b_a3b", "hardware=h100", "tensor_parallel_size=2", "expert_parallel_size=2",
           "pipeline_parallel_size=2", "workload.num_requests=30", "workload.rate=10"),
])
def test_fast_forward_prices_the_stages_identically(overrides):
    from servelab.kit.conformance_fast_forward import run_both_ways

    difference, forwarded, _ = run_both_ways(overrides, default_registry())
    assert difference is None, difference
    assert forwarded > 0 or "cluster.replicas=2" in overrides  # (a cluster's driver does not count them)


def test_a_moe_stage_prices_its_own_dense_and_moe_layers():
    tm = build_stack(compose(list(SIM + ("model=deepseek_v3", "model.quantization=int8", "hardware=h200",
                                        "tensor_parallel_size=8", "expert_parallel_size=8",
                                        "pipeline_parallel_size=2")))).time_model
    pricer = tm.chosen.pricer
    first, second = pricer._stage_curves
    assert pricer.pipeline.layout.layers == (31, 30)
    assert pricer.pipeline.layout.moe_share[0] == pytest.approx(28 / 58)  # its three dense layers are not MoE
    assert first[64] > second[64] * 31 / 30 * 1.005  # its three dense MLPs weigh more than MoE layers' dense parts


def test_an_autoscaled_replica_in_stages_counts_all_its_gpus():
    from servelab.cluster.build import build_cluster

    cfg = compose(list(LLAMA + ("tensor_parallel_size=4", "pipeline_parallel_size=2", "cluster.replicas=1",
                                "cluster.max_replicas=2", "autoscaler=threshold")))
    cluster = build_cluster(cfg)[0]
    assert cluster.autoscale.settings.gpus_per_replica == 8
    assert [r.gpu_offset for r in cluster.replicas] == [0, 8]  # a replica is 8 GPUs: the next one on the next node


def _event_period(t, x, h, rounds: int = 200) -> float:
    """The steady-state round of ``t[i][j]`` repeated: a serial host, each stage serving the micro-batches in
    order, a micro-batch's next round after its last stage (a direct event simulation)."""
    stages = len(t[0])
    stage_free, ready, host_free, ends = [0.0] * stages, [0.0] * len(t), 0.0, []
    for _ in range(rounds):
        for i, row in enumerate(t):
            host_free = max(ready[i], host_free) + h[i]
            now = host_free
            for j, seconds in enumerate(row):
                stage_free[j] = max(now, stage_free[j]) + seconds
                now = stage_free[j] + (x[i] if j < stages - 1 else 0.0)
            ready[i] = now
        ends.append(max(ready))
    half = rounds // 2
    return (ends[-1] - ends[half]) / (rounds - 1 - half)


@pytest.mark.parametrize("stages", [2, 3, 4])
def test_the_round_formula_is_the_event_simulations_steady_state(stages):
    import random

    from servelab.sim.pipeline import PipelineBooks, StageLayout

    rng = random.Random(stages)
    for _ in range(30):
        share = [rng.uniform(0.8, 1.2) for _ in range(stages)]
        bandwidth, latency = rng.uniform(1, 10), rng.uniform(0, 0.05)
        layout = StageLayout(tuple([1] * stages), tuple(share), tuple(rng.uniform(0.5, 1.5) for _ in range(stages)),
                             ((bandwidth, latency),) * (stages - 1), 1.0, 0)
        parts = []
        for _ in range(stages):  # micro-batches of very different weight (a prompt chunk among decodes)
            w = rng.choice([rng.uniform(0.2, 1), rng.uniform(1, 20)])
            parts.append(([w * f for f in share], rng.uniform(0, 2), rng.uniform(0, 0.5), rng.uniform(0, 0.3),
                          rng.randint(1, 4)))
        t = [[p[0][j] + p[1] * layout.moe_share[j] + (p[2] if j == stages - 1 else 0.0) for j in range(stages)]
             for p in parts]
        x = [p[4] / bandwidth + latency for p in parts]
        assert PipelineBooks(layout).round_seconds(parts, True) == pytest.approx(
            _event_period(t, x, [p[3] for p in parts]), rel=1e-6, abs=1e-9)
