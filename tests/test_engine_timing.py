"""The simulator's engine timing features (docs/simulator.md "Engine timing features"):
``sim.cuda_graphs`` (decode padded to a captured batch size), ``sim.all_reduce`` (NCCL tables vs
the published custom all-reduce) and ``frontend`` (the API server's time): defaults leave a run as
it was, each feature prices what it says, and fast-forward stays exact with each on."""

from __future__ import annotations

import json

import pytest

from servelab.api import compose
from servelab.core.contexts import TimeModelContext
from servelab.core.errors import ConfigError
from servelab.core.registry import default_registry
from servelab.core.request import Request
from servelab.core.step_work import StepWork
from servelab.engine.frontend import FrontEnd
from servelab.kit.conformance_fast_forward import run_both_ways
from servelab.run.session import run_job
from servelab.assemble.executor import model_shape
from servelab.assemble.stack import build_stack
from servelab.sim.all_reduce import CUSTOM_MAX_BYTES
from servelab.sim.op_tables import custom_allreduce_curve, find_op_tables
from servelab.sim.step_pricer import graph_sizes

SIM_8B = ("backend=sim", "hardware=h100", "model=llama3_8b", "workload.num_requests=30", "workload.rate=8")
SIM_70B_TP4 = ("backend=sim", "hardware=h100", "model=llama3_70b", "tensor_parallel_size=4",
               "workload.num_requests=30", "workload.rate=4")


def run(tmp_path, name, *overrides):
    cfg = compose(list(overrides), logger="none", progress=False)
    run_job(cfg, tmp_path / name)
    summary = json.loads((tmp_path / name / "summary.json").read_text())
    records = [json.loads(line) for line in (tmp_path / name / "requests.jsonl").read_text().splitlines()]
    return summary, records


def time_model(*overrides):
    cfg = compose(list(overrides), logger="none", progress=False)
    return build_stack(cfg).time_model


@pytest.mark.parametrize("explicit", [("sim.cuda_graphs=false",), ("sim.all_reduce=nccl",), ("frontend=none",)])
def test_defaults_leave_the_run_as_it_was(tmp_path, explicit):
    base = run(tmp_path, "base", *SIM_70B_TP4)
    same = run(tmp_path, "explicit", *SIM_70B_TP4, *explicit)
    assert (tmp_path / "base" / "summary.json").read_bytes() == (tmp_path / "explicit" / "summary.json").read_bytes()
    assert base[1] == same[1]
    assert not {"cuda_graph_steps", "all_reduce_impl"} & set(base[0])


# ---- CUDA graphs -------------------------------------------------------------------------------

def test_graph_sizes_round_up_to_the_next_captured_size():
    table = graph_sizes([1, 2, 4, 8, 16])
    assert [table[b] for b in (1, 2, 3, 4, 5, 8, 9, 16)] == [1, 2, 4, 4, 8, 8, 16, 16]
    assert len(table) == 17  # 17 and above: eager
    assert graph_sizes([]) == []


def test_default_capture_sizes_are_vllms():
    cfg = compose(list(SIM_8B), logger="none")
    assert list(cfg.sim.cuda_graph_sizes) == [1, 2, 4] + list(range(8, 257, 8))


def test_a_decode_step_of_5_is_priced_as_8_and_other_steps_eagerly():
    eager = time_model(*SIM_70B_TP4)
    graphs = time_model(*SIM_70B_TP4, "sim.cuda_graphs=true")

    def decode(b, context=4000):
        return StepWork(num_tokens=b, num_seqs=b, decode_seqs=b, num_sampled=b, attended=context, context_tokens=context)

    five, eight = graphs.breakdown(decode(5)), eager.breakdown(decode(8))
    assert five["layers"] == eight["layers"] and five["communication"] == eight["communication"]
    assert five["attention"] == eager.breakdown(decode(5))["attention"]  # the real sequences' attention
    assert graphs.predict(decode(5)) > eager.predict(decode(5))
    assert graphs.predict(decode(8)) == eager.predict(decode(8))  # a captured size pads nothing
    assert graphs.predict(decode(300)) == eager.predict(decode(300))  # above 256: eager
    mixed = StepWork(num_tokens=105, num_seqs=6, prefill_tokens=100, decode_seqs=5, num_sampled=6, attended=9000,
                     context_tokens=4100)
    assert graphs.predict(mixed) == eager.predict(mixed)
    summary = graphs.timing_summary()  # decode(5) and decode(8) ran in a graph; 3 padded tokens
    assert (summary["cuda_graph_steps"], summary["cuda_graph_padding_tokens"]) == (2, 3)


def test_graphs_reported_in_the_summary_and_slow_small_decodes(tmp_path):
    eager, _ = run(tmp_path, "eager", *SIM_8B)
    graphs, _ = run(tmp_path, "graphs", *SIM_8B, "sim.cuda_graphs=true")
    assert graphs["cuda_graph_steps"] > 0 and graphs["cuda_graph_padding_tokens"] > 0
    assert 0 < graphs["cuda_graph_padding_share"] < 1
    assert graphs["tpot_ms"]["mean"] >= eager["tpot_ms"]["mean"] - 1e-9  # padding only adds work


def test_a_cluster_sums_graph_steps_over_its_replicas(tmp_path):
    cluster, _ = run(tmp_path, "cluster", *SIM_8B, "cluster.replicas=2", "sim.cuda_graphs=true")
    steps = [replica["num_steps"] for replica in cluster["per_replica"]]
    assert cluster["cuda_graph_steps"] > max(steps)  # more than either replica stepped: both are counted
    assert cluster["cuda_graph_steps"] <= sum(steps)
    assert cluster["cuda_graph_padding_share"] == pytest.approx(
        cluster["cuda_graph_padding_tokens"] / (cluster["cuda_graph_tokens"] + cluster["cuda_graph_padding_tokens"]))


def test_bad_capture_sizes_are_one_line():
    with pytest.raises(ConfigError, match="sim.cuda_graph_sizes"):
        build_stack(compose([*SIM_8B, "sim.cuda_graphs=true", "sim.cuda_graph_sizes=[0,8]"], logger="none"))


# ---- all-reduce ----------------------------------------------------------------------------------

@pytest.mark.parametrize("hardware,tp", [("h100", 2), ("h100", 4), ("h100", 8), ("a100_80gb", 2), ("a100_80gb", 4)])
def test_custom_all_reduce_is_cheaper_than_nccl_at_small_sizes(hardware, tp):
    custom = custom_allreduce_curve(hardware, tp)
    cfg = compose(["backend=sim", f"hardware={hardware}", "model=llama3_70b"], logger="none")
    nccl = find_op_tables(hardware, model_shape(cfg), tp, "bfloat16")
    assert custom is not None and nccl is not None
    # a decode batch of 8 .. 64 tokens of a 70B's hidden (16 KiB per token); at TP 2 below ~32 KiB the
    # NCCL table (profiler kernel time, 7-9 us) is not above the custom figures (host-timed, launch included)
    sizes = (2048, 16384, 131072, 1 << 20) if tp >= 4 else (131072, 1 << 20)
    for nbytes in sizes:
        assert custom(nbytes) < nccl.allreduce_curve(tp)(nbytes), (hardware, tp, nbytes)


def test_custom_and_auto_price_the_steps_and_say_so(tmp_path):
    nccl, _ = run(tmp_path, "nccl", *SIM_70B_TP4)
    custom, _ = run(tmp_path, "custom", *SIM_70B_TP4, "sim.all_reduce=custom")
    auto, _ = run(tmp_path, "auto", *SIM_70B_TP4, "sim.all_reduce=auto")
    assert custom["all_reduce_impl"] == "custom" and auto["all_reduce_impl"].startswith("auto")
    assert custom["tpot_ms"]["p50"] < nccl["tpot_ms"]["p50"]


def test_auto_uses_nccl_past_the_custom_kernels_limit():
    nccl = time_model(*SIM_70B_TP4)
    auto = time_model(*SIM_70B_TP4, "sim.all_reduce=auto")
    hidden_bytes = 8192 * 2
    small, large = 8, CUSTOM_MAX_BYTES // hidden_bytes + 8  # tokens: a decode batch, a prefill past 8 MiB
    for n, cheaper in ((small, True), (large, False)):
        work = StepWork(num_tokens=n, num_seqs=1, prefill_tokens=n, num_sampled=1, attended=n * n // 2,
                        context_tokens=n)
        a, b = auto.breakdown(work)["communication"], nccl.breakdown(work)["communication"]
        assert (a < b) if cheaper else (a == b), (n, a, b)


def test_custom_without_published_figures_is_refused_in_one_line():
    with pytest.raises(ConfigError, match=r"^sim.all_reduce=custom: no published custom all-reduce figures for "
                                          r"hardware=l40s"):
        build_stack(compose(["backend=sim", "hardware=l40s", "model=llama3_8b", "tensor_parallel_size=2",
                             "sim.all_reduce=custom"], logger="none"))
    tm = time_model("backend=sim", "hardware=l40s", "model=llama3_8b", "tensor_parallel_size=2", "sim.all_reduce=auto")
    assert "nccl (auto: no published custom" in tm.timing_summary()["all_reduce_impl"]


def test_h200_prices_its_all_reduce_with_h100s_custom_figures_by_its_rule():
    """hardware.tables_from: h100 (the same NVLink 4 baseboard): H100's published custom figures."""
    h200 = time_model("backend=sim", "hardware=h200", "model=llama3_8b", "tensor_parallel_size=2", "sim.all_reduce=custom")
    h100 = time_model("backend=sim", "hardware=h100", "model=llama3_8b", "tensor_parallel_size=2", "sim.all_reduce=custom")
    work = StepWork(num_tokens=8, num_seqs=8, decode_seqs=8, num_sampled=8, attended=8 * 512, context_tokens=8 * 512)
    assert h200.timing_summary()["all_reduce_impl"] == "custom"
    assert h200.breakdown(work)["communication"] == h100.breakdown(work)["communication"] > 0


def test_context_defaults_are_todays():
    ctx = TimeModelContext.__dataclass_fields__
    assert ctx["cuda_graph_sizes"].default == () and ctx["all_reduce"].default == "nccl"


# ---- front end -----------------------------------------------------------------------------------

def test_the_front_end_is_a_serial_queue():
    fe = FrontEnd(per_output_token_s=0.01)
    assert fe.deliver(1.0, 3) == pytest.approx(1.03)  # idle: starts at the step's end
    assert fe.deliver(1.01, 2) == pytest.approx(1.05)  # busy: queues behind the previous step's tokens
    assert fe.deliver(2.0, 1) == pytest.approx(2.01)
    assert FrontEnd(per_output_token_s=0.01, in_engine_process=True).deliver(1.0, 3) == 1.0


def test_requests_reach_the_engine_after_their_front_end_cost_in_that_order():
    fe = FrontEnd(per_request_s=0.5, per_prompt_token_s=0.1)
    sent = [Request("long", tuple(range(20)), 4, arrival_time=0.0), Request("short", (1,), 4, arrival_time=1.0)]
    out = list(fe.arrivals(sent, time_scale=1.0))
    assert [r.id for r in out] == ["short", "long"]  # 0 + 0.5 + 2.0 = 2.5 > 1 + 0.5 + 0.1
    assert [r.arrival_time for r in out] == pytest.approx([1.6, 2.5])
    assert [r.sent_time for r in out] == [1.0, 0.0]


def test_frontend_delays_ttft_by_the_request_cost_and_never_changes_tokens(tmp_path):
    base, base_recs = run(tmp_path, "base", *SIM_8B)
    fe, fe_recs = run(tmp_path, "fe", *SIM_8B, "workload.num_requests=1", "frontend.per_request_s=0.25")
    one, _ = run(tmp_path, "one", *SIM_8B, "workload.num_requests=1")
    assert fe["ttft_ms"]["p50"] == pytest.approx(one["ttft_ms"]["p50"] + 250.0)
    fe_all, fe_all_recs = run(tmp_path, "fe_all", *SIM_8B, "frontend.per_request_s=0.01",
                              "frontend.per_prompt_token_s=1e-5", "frontend.per_output_token_s=2e-4")
    by_id = {r["id"]: r for r in base_recs}
    for r in fe_all_recs:
        b = by_id[r["id"]]
        assert r["output_token_ids"] == b["output_token_ids"] and r["arrival_s"] == b["arrival_s"]
        assert r["ttft_ms"] >= 10.0
    assert fe_all["ttft_ms"]["p50"] > base["ttft_ms"]["p50"] + 10.0


def test_in_engine_process_adds_the_token_work_to_the_steps(tmp_path):
    out, _ = run(tmp_path, "out", *SIM_8B, "frontend.per_output_token_s=5e-4")
    inside, _ = run(tmp_path, "in", *SIM_8B, "frontend.per_output_token_s=5e-4", "frontend.in_engine_process=true")
    base, _ = run(tmp_path, "base", *SIM_8B)
    assert inside["tpot_ms"]["p50"] > base["tpot_ms"]["p50"]
    assert inside["duration_s"] > out["duration_s"]


def test_presets_compose_and_the_wall_clock_refuses_a_front_end():
    for name in ("none", "servelab_cpu"):
        assert compose([*SIM_8B, f"frontend={name}"], logger="none").frontend.name == name
    with pytest.raises(ConfigError, match="^frontend=servelab_cpu: the front-end model prices the virtual clock"):
        build_stack(compose(["model=tiny", "workload=synthetic", "frontend=servelab_cpu"], logger="none"))


# ---- fast-forward stays exact ----------------------------------------------------------------------

@pytest.mark.parametrize("feature", [
    ("sim.cuda_graphs=true",),
    ("sim.all_reduce=auto",),
    ("frontend.per_request_s=0.02", "frontend.per_prompt_token_s=1e-5", "frontend.per_output_token_s=3e-4"),
    ("frontend.per_output_token_s=3e-4", "frontend.in_engine_process=true"),
])
def test_fast_forward_on_and_off_identical_with_each_feature(feature):
    difference, forwarded, steps = run_both_ways(SIM_70B_TP4 + feature, default_registry())
    assert difference is None, difference
    assert forwarded > 0, (forwarded, steps)
