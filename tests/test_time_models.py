"""Time models: the roofline reproduces the seeds' exact arithmetic; profiles fit and round-trip;
bad combinations of clock, backend and time model fail with a clear line."""

from __future__ import annotations

import logging

import pytest

from conftest import compose
from servelab.core.errors import ConfigError
from servelab.core.interfaces import TimeModelContext
from servelab.plugins.time_models.profile import ProfileConfig, ProfileTime
from servelab.plugins.time_models.roofline import RooflineConfig, RooflineTime
from servelab.core.shapes import HardwareProfile, ModelShape
from servelab.assemble.executor import model_shape
from servelab.assemble.stack import build_stack
from servelab.sim.step_profile import StepProfile, feature_vector, fit_profile
from servelab.core.step_work import StepWork

LLAMA_70B = ModelShape(num_layers=80, hidden_size=8192, intermediate_size=28672, num_heads=64, num_kv_heads=8,
                       head_dim=128, vocab_size=32000)
SEED_A100 = HardwareProfile("a100_2tb", memory_gb=80, hbm_bandwidth_gb_s=2000, peak_tflops=312,
                            link_bandwidth_gb_s=300, host_link_gb_s=32, link_latency_us=0.0)
EXACT = RooflineConfig(flops_efficiency=1.0, bandwidth_efficiency=1.0, link_efficiency=1.0, step_overhead_ms=0.0)


def roofline(shape=LLAMA_70B, hardware=SEED_A100, tp=1, config=EXACT, block_size=16):
    ctx = TimeModelContext(shape, hardware, tp, "float16", 2.0, 2.0, block_size, "llama2_70b")
    return RooflineTime(config, ctx)


def decode(batch: int, context: int) -> StepWork:
    return StepWork(num_tokens=batch, num_seqs=batch, decode_seqs=batch, num_sampled=batch,
                    attended=batch * context, context_tokens=batch * context)


def test_llama_70b_shape_has_70b_parameters():
    assert LLAMA_70B.num_params == pytest.approx(68.98e9, rel=1e-3)
    assert LLAMA_70B.weight_bytes(2) == pytest.approx(138e9, rel=1e-2)


def test_kv_bytes_per_token_of_the_70b_shape_and_of_the_seeds_64_head_assumption():
    assert LLAMA_70B.kv_bytes_per_token(2) == 2 * 80 * 8 * 128 * 2 == 327_680  # 0.33 MB (GQA, 8 KV heads)
    seed_mha = ModelShape(80, 8192, 28672, 64, 64, 128, 32000)
    assert seed_mha.kv_bytes_per_token(2) == 2_621_440  # the seed's 2.6 MB assumes 64 KV heads
    assert LLAMA_70B.kv_bytes_per_token(2, tp=8) == 327_680 / 8
    assert LLAMA_70B.kv_bytes_per_token(2, tp=16) == 327_680 / 8  # KV heads replicated past 8 ranks


def test_batch_1_decode_of_70b_on_2tb_s_is_weights_over_bandwidth():
    """The seed: 140 GB of fp16 weights / 2 TB/s = 70 ms per batch-1 decode step."""
    model = roofline()
    t = model.predict(decode(1, 1))
    read = (LLAMA_70B.num_params - LLAMA_70B.vocab_size * LLAMA_70B.hidden_size) * 2  # the embedding is looked up
    parts = model.breakdown(decode(1, 1))
    assert parts["linear"] == pytest.approx(read / 2e12, rel=1e-3)
    assert t == pytest.approx(0.070, rel=0.02)
    assert sum(parts.values()) == pytest.approx(t)


def test_decode_is_flat_in_batch_and_prefill_is_compute_bound():
    model = roofline()
    b1, b64 = model.predict(decode(1, 512)), model.predict(decode(64, 512))
    assert b64 / b1 < 1.5  # weight-bandwidth bound: 64 sequences cost little more than one
    prefill = StepWork(num_tokens=4096, num_seqs=1, prefill_tokens=4096, num_sampled=1,
                       attended=4096 * 4097 // 2, context_tokens=4096)
    parts = model.breakdown(prefill)
    flops = 2 * 4096 * 80 * LLAMA_70B.layer_linear_params
    assert parts["linear"] == pytest.approx(flops / 312e12, rel=0.01)


def test_tensor_parallel_divides_weights_and_adds_ring_all_reduces():
    t1, t8 = roofline(tp=1), roofline(tp=8)
    w = decode(1, 1)
    assert t8.breakdown(w)["linear"] == pytest.approx(t1.breakdown(w)["linear"] / 8, rel=1e-3)
    comm = t8.breakdown(decode(32, 100))["communication"]
    ring = 2 * 7 / 8 * (32 * 8192 * 2) / 300e9
    assert comm == pytest.approx(2 * 80 * ring)
    assert t1.breakdown(w)["communication"] == 0


def test_swap_copies_cross_the_host_link():
    model = roofline()
    blocks = 10
    assert model.breakdown(StepWork(swap_out_blocks=blocks))["swap"] == pytest.approx(
        blocks * 16 * 327_680 / 32e9)


def test_roofline_rejects_an_efficiency_outside_0_1():
    with pytest.raises(ValueError, match="time_model.flops_efficiency"):
        roofline(config=RooflineConfig(flops_efficiency=1.5))


def _synthetic_steps(n=200):
    import random

    rng = random.Random(0)
    works, secs = [], []
    for _ in range(n):
        seqs = rng.randint(1, 32)
        prefill = rng.choice([0, 0, rng.randint(16, 512)])
        ctx = rng.randint(seqs * 16, seqs * 600)
        w = StepWork(num_tokens=seqs + prefill, num_seqs=seqs, prefill_tokens=prefill, decode_seqs=seqs,
                     num_sampled=seqs, attended=ctx + prefill * 200, context_tokens=ctx)
        works.append(w)
        secs.append(0.003 + 2e-4 * w.num_tokens + 1e-4 * seqs + 5e-6 * w.attended / 1e3 + 1e-4 * ctx / 1e3)
    return works, secs


def test_profile_fit_recovers_a_linear_step_time_and_round_trips(tmp_path):
    works, secs = _synthetic_steps()
    prof = fit_profile(works, secs, source={"model": "m", "dtype": "float32"})
    assert prof.fit["r2"] > 0.999 and prof.fit["mean_abs_pct_error"] < 0.01
    path = prof.save(tmp_path / "p.json")
    again = StepProfile.load(path)
    for w, s in zip(works[:20], secs[:20]):
        assert again.predict(w) == pytest.approx(s, rel=0.02)
    assert len(again.coefficients) == len(feature_vector(works[0], again.knots, again.decode_knots))


def test_profile_decode_knots_fit_a_cost_per_sequence_that_falls_with_the_batch(tmp_path):
    """A CPU's decode cost is steeper at batch 1-4 than past it: the decode knots price both."""
    works, secs = [], []
    for batch in (1, 2, 3, 4, 6, 8, 16, 32, 64):
        for ctx in (32, 500):
            w = StepWork(num_tokens=batch, num_seqs=batch, decode_seqs=batch, num_sampled=batch,
                         attended=batch * ctx, context_tokens=batch * ctx)
            works.append(w)
            secs.append(0.003 + 1e-3 * min(batch, 4) + 2e-4 * max(0, batch - 4) + 1e-4 * batch * ctx / 1e3)
    prof = fit_profile(works, secs)
    assert prof.decode_knots and "decode_over_4" in prof.to_json()["features"]
    again = StepProfile.load(prof.save(tmp_path / "p.json"))
    for w, s in zip(works, secs):
        assert again.predict(w) == pytest.approx(s, rel=0.01)
    linear = fit_profile(works, secs, decode_knots=())  # one decode term: batch 1 comes out dear
    assert linear.predict(works[0]) > 1.1 * secs[0]


def test_a_version_1_profile_still_loads_and_a_mismatched_one_is_refused(tmp_path):
    import json

    works, secs = _synthetic_steps()
    prof = fit_profile(works, secs, decode_knots=())
    data = {**prof.to_json(), "format": "servelab-profile/1"}
    del data["decode_knots"]
    (tmp_path / "v1.json").write_text(json.dumps(data))
    v1 = StepProfile.load(tmp_path / "v1.json")
    assert v1.decode_knots == () and v1.predict(works[0]) == prof.predict(works[0])
    (tmp_path / "bad.json").write_text(json.dumps({**prof.to_json(), "coefficients": prof.coefficients[:-1]}))
    with pytest.raises(ConfigError, match="do not match its knots"):
        StepProfile.load(tmp_path / "bad.json")


def test_profile_time_model_needs_a_path_naming_the_command():
    ctx = TimeModelContext(LLAMA_70B, SEED_A100, 1, "float32", 4, 4, 16, "tiny")
    with pytest.raises(ConfigError, match="servelab profile"):
        ProfileTime(ProfileConfig(path=None), ctx)


def test_profile_of_another_model_warns_naming_both(tmp_path, caplog):
    works, secs = _synthetic_steps()
    path = fit_profile(works, secs, source={"model": "tiny_code", "dtype": "float32"}).save(tmp_path / "p.json")
    ctx = TimeModelContext(LLAMA_70B, SEED_A100, 1, "bfloat16", 2, 2, 16, "llama2_70b")
    with caplog.at_level(logging.WARNING):
        ProfileTime(ProfileConfig(path=str(path)), ctx)
    assert "'tiny_code' vs run 'llama2_70b'" in caplog.text and "'float32' vs run 'bfloat16'" in caplog.text


@pytest.mark.parametrize("overrides, message", [
    (["time_model=roofline"], "add clock=virtual"),
    (["clock=virtual"], "clock=virtual needs a time model"),
    (["backend=sim", "clock=wall"], "backend=sim has no wall time"),
    (["backend=sim", "hardware.hbm_bandwidth_gb_s=0"], r"hardware.hbm_bandwidth_gb_s=0.0 must be > 0"),
    (["backend=sim", "backend.activation_reserve_gb=-1"], "backend.activation_reserve_gb=-1.0 must be >= 0"),
])
def test_inconsistent_clock_and_time_model_fail_with_one_line(overrides, message):
    with pytest.raises(ConfigError, match=message):
        build_stack(compose(*overrides, "model.hidden_size=32", "model.intermediate_size=64",
                            "model.num_hidden_layers=1", "model.num_attention_heads=2", "model.num_key_value_heads=1"))


def test_catalogue_shapes_match_their_config_json():
    cfg = compose("model=llama3_70b")
    shape = model_shape(cfg)
    assert (shape.num_layers, shape.hidden_size, shape.num_kv_heads, shape.vocab_size) == (80, 8192, 8, 128256)
    assert shape.num_params == pytest.approx(70.55e9, rel=1e-3)
    assert cfg.max_model_len == 16384


def test_model_path_may_point_at_any_config_json(tmp_path):
    import json

    (tmp_path / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "hidden_size": 512, "intermediate_size": 1024,
        "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2, "vocab_size": 1000}))
    shape = model_shape(compose("backend=sim", "model=hf", f"model.path={tmp_path / 'config.json'}"))
    assert (shape.num_layers, shape.num_kv_heads, shape.head_dim) == (4, 2, 64)


def test_unknown_hardware_lists_the_known_ones():
    with pytest.raises(ConfigError) as err:
        compose("hardware=h1000")
    assert all(name in str(err.value) for name in ("a100_80gb", "b200", "h100", "h200", "l40s"))


def test_servelab_profile_fits_the_real_engine_and_a_virtual_run_uses_it(tmp_path, caplog):
    """The command end to end on a very small model: a profile with its provenance, usable at once."""
    import json

    from servelab.cli.profile import profile_main
    from servelab.run.session import run_job

    small = ["model=tiny", "model.hidden_size=32", "model.intermediate_size=64", "model.num_hidden_layers=1",
             "model.num_attention_heads=2", "model.num_key_value_heads=1", "model.vocab_size=256"]
    limits = ["max_num_seqs=4", "max_model_len=256", "max_num_batched_tokens=128", "backend.num_threads=1"]
    out = tmp_path / "profile.json"
    assert profile_main([f"--out={out}", "--rounds=2", *small, *limits]) == 0
    data = json.loads(out.read_text())
    assert data["fit"]["num_steps"] >= 30 and len(data["samples"]) == data["fit"]["num_steps"]
    src = data["source"]
    # the decode phases repeat step for step: each distinct step is one median of its rounds
    assert src["rounds"] == 2 and data["fit"]["num_steps"] < src["measured_steps"]
    assert (src["model"], src["dtype"], src["backend"], src["num_threads"]) == ("tiny", "float32", "torch", 1)
    assert src["shape"]["hidden_size"] == 32 and src["machine"]["cores"]
    swap_s = data["coefficients"][data["features"].index("swap_blocks")]
    assert swap_s == pytest.approx(build_stack(compose(*small, *limits)).executor.bytes_per_block / src["swap_bytes_per_s"])
    run = ["clock=virtual", "time_model=profile", f"time_model.path={out}", "workload.num_requests=8",
           "workload.prompt_len.max=64", "workload.output_len.max=8"]
    a = run_job(compose(*small, *limits, *run), tmp_path / "a").summary
    b = run_job(compose(*small, *limits, *run), tmp_path / "b").summary
    assert a["num_finished"] == 8 and a["duration_s"] == b["duration_s"] > 0
    assert a["time_model"]["source"]["shape"]["hidden_size"] == 32
    with caplog.at_level(logging.WARNING):  # the same profile on a wider model: warned, naming the shapes
        build_stack(compose(*[s.replace("=32", "=64") for s in small], *limits, *run[:3]))
    assert "hidden_size 32 vs 64" in caplog.text


def test_a_profile_prices_each_distinct_step_by_the_median_of_its_rounds():
    """A burst of other work during one round moves that round's times, not the profile."""
    from servelab.cli.profile import median_per_step, profile_main
    from servelab.core.step_work import StepWork

    decode = StepWork(num_tokens=4, num_seqs=4, decode_seqs=4, num_sampled=4, attended=400, context_tokens=400)
    prefill = StepWork(num_tokens=64, num_seqs=1, prefill_tokens=64, num_sampled=1, attended=2080, context_tokens=64)
    works, seconds = median_per_step([decode, prefill, decode, decode], [0.004, 0.020, 0.009, 0.005])
    assert dict(zip(works, seconds)) == {decode: 0.005, prefill: 0.020}
    with pytest.raises(ConfigError, match="--rounds=0 must be a positive integer"):
        profile_main(["--rounds=0"])


def test_the_probe_measures_prefill_chunks_over_earlier_context(monkeypatch):
    """Chunked prefill (a chunk attending to its own earlier chunks, beside decodes) is a step
    shape of its own: the probe runs a phase of it under a small prefill cap."""
    from servelab.cli import profile as profiling
    from servelab.sim.step_profile import feature_names

    small = ["model=tiny", "model.hidden_size=32", "model.intermediate_size=64", "model.num_hidden_layers=1",
             "model.num_attention_heads=2", "model.num_key_value_heads=1", "model.vocab_size=256", "max_num_seqs=4",
             "max_model_len=256", "max_num_batched_tokens=128", "backend.num_threads=1"]

    def chunks_over_context(cap: int) -> int:
        monkeypatch.setattr(profiling, "CHUNK_CAP", cap)
        profile = profiling.measure_profile(small, rounds=1)
        names = feature_names(profile.knots, profile.decode_knots)
        p, attended = names.index("prefill_tokens"), names.index("attended_k")
        return sum(1 for s in profile.samples if 0 < s[p] <= 32 and s[attended] * 1e3 >= s[p] * 64)

    assert chunks_over_context(32) >= chunks_over_context(10**6) + 5  # 12 vs 0 when written
