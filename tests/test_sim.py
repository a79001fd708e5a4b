"""backend=sim and the virtual clock: memory accounting from the hardware, every plugin unchanged,
the same schedule as the real engine on the same time model, and results that do not depend on
the machine's load."""

from __future__ import annotations

import json
import multiprocessing as mp
import time

import pytest

from conftest import compose
from servelab.core.errors import ConfigError
from servelab.run.session import run_job
from servelab.assemble.stack import build_stack

TINY = ["model.hidden_size=64", "model.intermediate_size=128", "model.num_hidden_layers=2",
        "model.num_attention_heads=4", "model.num_key_value_heads=2", "model.vocab_size=512"]
WORKLOAD = ["workload.num_requests=24", "workload.rate=1000", "workload.prompt_len.max=96",
            "workload.output_len.max=24", "max_model_len=256"]
WALL_FIELDS = {"model_time_s", "comm_time_s"}  # the real executor's own timings: wall clock by nature


def test_sim_sizes_the_kv_pool_from_the_hardware():
    stack = build_stack(compose("backend=sim", "hardware=h100", "model=llama3_70b", "tensor_parallel_size=8"))
    ex = stack.executor
    weights = 70.55e9 * 2 / 8
    per_block = 2 * 80 * 1 * 128 * 2 * 16  # one KV head per rank at TP 8
    expected = int((80e9 * 0.9 - weights - 2e9) // per_block)
    assert ex.num_kv_blocks == pytest.approx(expected, rel=1e-3)
    assert ex.bytes_per_block == per_block
    assert stack.clock_kind == "virtual" and stack.time_model.name == "auto"
    assert stack.time_model.chosen.name == "op_profile"  # Vidur measured Llama-2-70B (same shape) at TP 8 on H100


def test_weights_that_do_not_fit_name_the_bytes_per_rank():
    with pytest.raises(ConfigError, match=r"141\.1 GB per rank at tensor_parallel_size=1.*72\.0 GB per rank"):
        build_stack(compose("backend=sim", "hardware=a100_80gb", "model=llama3_70b"))
    build_stack(compose("backend=sim", "hardware=a100_80gb", "model=llama3_70b", "tensor_parallel_size=4"))


def test_torch_backend_refuses_a_shape_only_model():
    with pytest.raises(ConfigError, match="model=llama2_7b is a shape from the catalogue"):
        build_stack(compose("model=llama2_7b"))


@pytest.mark.parametrize("scheduler", ["fcfs", "static", "priority", "slo_aware"])
@pytest.mark.parametrize("preemption", ["recompute", "swap", "adaptive"])
def test_every_policy_runs_unchanged_in_the_sim(tmp_path, scheduler, preemption):
    cfg = compose("backend=sim", f"scheduler={scheduler}", f"preemption={preemption}", "num_kv_blocks=24",
                  "backend.num_swap_blocks=64", "slo.ttft_ms=500", "slo.tpot_ms=50", *TINY, *WORKLOAD)
    result = run_job(cfg, tmp_path)
    s = result.summary
    assert s["num_finished"] == 24 and s["leaked_blocks"] == 0 and s["num_preemptions"] > 0
    assert all(r["output_len"] == r["max_tokens"] for r in result.requests)  # placeholders never stop
    assert all(r["output_token_ids"] is None for r in result.requests)  # ... and are not written out
    assert s["clock"] == "virtual" and s["time_model"]["name"] == "auto" and s["hardware"] == "h100"


def _steps(path):
    return [json.loads(line) for line in (path / "steps.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("extra", [["chunked_prefill=true"], ["chunked_prefill=false", "max_num_batched_tokens=256",
                                                                 "preemption=swap", "backend.num_swap_blocks=64"]])
def test_sim_and_the_real_engine_on_the_virtual_clock_make_the_same_schedule(tmp_path, extra):
    """The simulator is the engine: same plans step by step, same metrics."""
    common = ["time_model=roofline", "num_kv_blocks=20", "debug.log_steps=true", *TINY, *WORKLOAD, *extra]
    sim = run_job(compose("backend=sim", *common), tmp_path / "sim")
    real = run_job(compose("backend=torch", "clock=virtual", *common), tmp_path / "real")
    sim_steps, real_steps = _steps(tmp_path / "sim"), _steps(tmp_path / "real")
    assert len(sim_steps) == len(real_steps) > 20
    for a, b in zip(sim_steps, real_steps):
        for key in ("time_s", "duration_s", "scheduled", "preempted", "swap_out_blocks", "swap_in_blocks", "queues"):
            assert a[key] == b[key], (a["step"], key)
    assert real.summary["num_preemptions"] > 0
    for key in ("duration_s", "ttft_ms", "tpot_ms", "itl_ms", "e2e_ms", "num_preemptions", "output_tokens"):
        assert sim.summary[key] == real.summary[key], key
    assert [r["ttft_ms"] for r in sim.requests] == [r["ttft_ms"] for r in real.requests]


def _burn(stop_at: float) -> None:
    x = 0
    while time.time() < stop_at:
        x += 1


def test_virtual_clock_results_do_not_depend_on_the_machine_load(tmp_path):
    """Two runs of one stack on the real model and the virtual clock, the second under a CPU hog:
    identical requests.jsonl and summary (apart from fields that state wall time)."""
    overrides = ["clock=virtual", "time_model=roofline", "hardware=l40s", "scheduler=slo_aware",
                 "slo.ttft_ms=200", "slo.tpot_ms=30", "num_kv_blocks=24", *TINY, *WORKLOAD]
    run_job(compose(*overrides), tmp_path / "quiet")
    hogs = [mp.get_context("spawn").Process(target=_burn, args=(time.time() + 60,)) for _ in range(2)]
    for h in hogs:
        h.start()
    try:
        run_job(compose(*overrides), tmp_path / "loaded")
    finally:
        for h in hogs:
            h.terminate()
            h.join()
    quiet, loaded = (json.loads((tmp_path / d / "summary.json").read_text()) for d in ("quiet", "loaded"))
    assert quiet["num_preemptions"] > 0
    assert {k: v for k, v in quiet.items() if k not in WALL_FIELDS} == {
        k: v for k, v in loaded.items() if k not in WALL_FIELDS}
    assert (tmp_path / "quiet" / "requests.jsonl").read_text() == (tmp_path / "loaded" / "requests.jsonl").read_text()


def test_the_70b_tp8_trace_command_writes_the_usual_results(tmp_path):
    from test_cli import run_cli

    proc = run_cli("backend=sim", "hardware=h100", "model=llama3_70b", "tensor_parallel_size=8", "workload=trace",
                   "workload.path=azure_conv", "workload.num_requests=300",
                   "scheduler=slo_aware", "slo.ttft_ms=2000", "slo.tpot_ms=100", "logger=none",
                   f"hydra.run.dir={tmp_path}")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["num_finished"] == 300 and summary["leaked_blocks"] == 0
    assert (summary["clock"], summary["hardware"], summary["tensor_parallel_size"]) == ("virtual", "h100", 8)
    assert 0.005 < summary["tpot_ms"]["p50"] / 1e3 < 0.05  # a 70B decode step on 8 x H100: milliseconds
