"""Engine presets (``engine=``, docs/simulator.md "Engines"): each preset composes and runs, its keys
stay overrides, every value it sets cites a source, the default prices steps as before, the host model
and ``overlap`` price what they say, fast-forward stays exact, and hardware without tables follows
its stated rule (H200 by H100's tables at its own HBM, B200 roofline only)."""

from __future__ import annotations

import functools
import json
import random
from importlib import resources

import numpy as np
import pytest
import yaml

from servelab.api import compose
from servelab.assemble.stack import build_stack
from servelab.config.engine import engine_host, vllm_large_gpu
from servelab.core.contexts import TimeModelContext
from servelab.core.engine_host import EngineHost
from servelab.core.errors import ConfigError
from servelab.core.registry import default_registry
from servelab.core.step_work import StepWork
from servelab.kit.conformance_fast_forward import run_both_ways
from servelab.run.session import run_job
from servelab.sim.gpu_ops import Calibration, GpuOps
from servelab.sim.hardware_rule import hbm_rescaled, spec_sheet
from servelab.sim.step_pricer import StepPricer

PRESETS = ("servelab", "vllm_v0", "vllm_v1", "sglang")
SIM_8B = ("backend=sim", "hardware=h100", "model=llama3_8b", "workload.num_requests=24", "workload.rate=8")


def preset_yaml(name: str) -> dict:
    return yaml.safe_load((resources.files("servelab.conf") / "engine" / f"{name}.yaml").read_text())


def _set_keys(node: dict, prefix: str = "") -> list[str]:
    out = []
    for key, value in node.items():
        if key in ("defaults", "engine"):
            continue
        path = f"{prefix}{key}"
        out += _set_keys(value, path + ".") if isinstance(value, dict) else [path]
    return out


def test_the_presets_are_the_files_and_the_default_is_servelab():
    names = sorted(p.name[:-5] for p in (resources.files("servelab.conf") / "engine").iterdir()
                   if p.name.endswith(".yaml"))
    assert names == sorted(PRESETS)
    assert compose([], logger="none").engine.name == "servelab"


@pytest.mark.parametrize("name", PRESETS)
def test_every_value_a_preset_sets_cites_its_source(name):
    data = preset_yaml(name)
    cites = data["engine"]["cites"]
    keys = _set_keys(data) + (["frontend"] if any("/frontend" in str(d) for d in data.get("defaults", [])) else [])
    keys += ["overlap", "host"] if data["engine"]["host"]["source"] == "time_model" else \
        ["overlap", "host.per_step_us", "host.per_seq_us", "host.per_token_us"]
    missing = [k for k in keys if not str(cites.get(k, "")).strip()]
    assert not missing, f"engine={name} sets {missing} without a cite"


@pytest.mark.parametrize("name", PRESETS)
def test_each_preset_runs_and_is_named_in_the_banner_and_summary(tmp_path, name, capsys):
    cfg = compose([*SIM_8B, f"engine={name}"], logger="none", progress=False)
    summary = run_job(cfg, tmp_path, banner=True).summary
    assert summary["engine"]["name"] == name and summary["num_finished"] == 24
    assert json.loads((tmp_path / "summary.json").read_text())["engine"]["name"] == name
    assert f"engine  {name} (" in capsys.readouterr().out


def test_preset_keys_stay_overrides():
    cfg = compose(["backend=sim", "hardware=h100", "model=llama3_8b", "engine=vllm_v1", "max_num_seqs=64",
                   "allocator.prefix_caching=false", "frontend=servelab_cpu", "engine.overlap=true"], logger="none")
    assert (cfg.max_num_seqs, cfg.allocator.prefix_caching, cfg.frontend.name) == (64, False, "servelab_cpu")
    assert cfg.max_num_batched_tokens == 8192 and engine_host(cfg.engine).overlap


@pytest.mark.parametrize("hardware, batched, seqs", [("h100", 8192, 1024), ("h200", 8192, 1024), ("b200", 8192, 1024),
                                                     ("a100_80gb", 2048, 256), ("l40s", 2048, 256)])
def test_vllm_v1_batch_defaults_follow_vllms_hardware_rule(hardware, batched, seqs):
    cfg = compose(["backend=sim", f"hardware={hardware}", "model=llama3_8b", "engine=vllm_v1"], logger="none")
    assert (cfg.max_num_batched_tokens, cfg.max_num_seqs) == (batched, seqs)
    assert vllm_large_gpu(80, "h100", 1, 0) == 1 and vllm_large_gpu(80, "a100_80gb", 1, 0) == 0


def test_vllm_v0_budget_is_the_context_or_2048():
    for mml, want in ((1024, 2048), (4096, 4096)):
        cfg = compose(["backend=sim", "model=llama3_8b", "engine=vllm_v0", f"max_model_len={mml}"], logger="none")
        assert cfg.max_num_batched_tokens == want and not cfg.chunked_prefill


def test_another_engine_on_the_wall_clock_is_one_line():
    with pytest.raises(ConfigError, match=r"^engine=vllm_v1 prices another engine's time on the virtual clock"):
        build_stack(compose(["engine=vllm_v1", "sim.cuda_graphs=false", "sim.all_reduce=nccl", "frontend=none"],
                            logger="none"))


def test_a_whole_step_time_model_refuses_an_engine_host_model():
    with pytest.raises(ConfigError, match=r"^engine=sglang prices the host's time apart"):
        build_stack(compose([*SIM_8B, "engine=sglang", "time_model=roofline", "sim.cuda_graphs=false",
                             "sim.all_reduce=nccl"], logger="none"))


# ---- the host model and overlap -------------------------------------------------------------------

@functools.lru_cache(maxsize=1)
def _shape_8b():
    return build_stack(compose(list(SIM_8B), logger="none")).executor.shape


def _pricer(engine: EngineHost | None) -> StepPricer:
    ctx = TimeModelContext(shape=_shape_8b(), hardware=spec_sheet("h100"), tensor_parallel_size=1, dtype="bfloat16",
                           weight_dtype_bytes=2, kv_dtype_bytes=2, block_size=16, engine_host=engine)
    ops = GpuOps(ctx.hardware, Calibration.load())
    return StepPricer(ctx, ops, layer=lambda m: ops.layer(m, ctx.shape, 1, 2, 2), allreduce=None, host=ops.host)


def _works(n: int = 60):
    rng = random.Random(0)
    for _ in range(n):
        seqs = rng.randint(1, 200)
        prefill = rng.choice([0, 0, rng.randint(1, 2048)])
        tokens = seqs + prefill
        yield StepWork(num_tokens=tokens, num_seqs=seqs, prefill_tokens=prefill, decode_seqs=seqs - (prefill > 0),
                       num_sampled=seqs, attended=tokens * 700, context_tokens=seqs * 700)


def test_the_default_engine_prices_every_step_as_before():
    before, default = _pricer(None), _pricer(EngineHost())
    assert default.engine_host is None  # the plain path: same code, same floats
    assert all(before.predict(w) == default.predict(w) for w in _works())


def test_engine_host_terms_and_overlap_price_what_they_say():
    eh = EngineHost(source="engine", per_step_s=4e-4, per_seq_s=2e-6, per_token_s=1e-7, engine="x")
    serial, overlapped = _pricer(eh), _pricer(EngineHost(**{**eh.__dict__, "overlap": True}))
    no_host = _pricer(EngineHost(source="engine", engine="x"))
    for w in _works():
        gpu = no_host.predict(w)
        host = 4e-4 + 2e-6 * w.num_seqs + 1e-7 * w.num_tokens
        assert serial.predict(w) == pytest.approx(gpu + host)
        assert overlapped.predict(w) == pytest.approx(max(gpu, host))
        assert sum(overlapped.breakdown(w).values()) == pytest.approx(overlapped.predict(w))
        assert sum(serial.breakdown(w).values()) == pytest.approx(serial.predict(w))


def test_overlap_keeps_the_time_models_host_and_hides_it():
    plain, hidden = _pricer(None), _pricer(EngineHost(overlap=True))
    w = StepWork(num_tokens=64, num_seqs=64, decode_seqs=64, num_sampled=64, attended=64 * 500, context_tokens=64 * 500)
    host = plain.breakdown(w)["host"]
    assert hidden.predict(w) == pytest.approx(max(plain.predict(w) - host, host))


def test_a_negative_host_term_is_one_line():
    with pytest.raises(ConfigError, match=r"^engine=vllm_v1: engine.host.per_seq_us must be >= 0$"):
        build_stack(compose([*SIM_8B, "engine=vllm_v1", "engine.host.per_seq_us=-1"], logger="none"))


@pytest.mark.parametrize("name", ["vllm_v1", "sglang"])
def test_fast_forward_on_and_off_identical_with_each_engine(name):
    difference, forwarded, steps = run_both_ways(
        ("backend=sim", "hardware=h100", "model=llama3_70b", "tensor_parallel_size=4", "workload.num_requests=30",
         "workload.rate=4", f"engine={name}"), default_registry())
    assert difference is None, difference
    assert forwarded > 0, (forwarded, steps)


# ---- hardware without tables ------------------------------------------------------------------------

def test_h200_uses_h100s_tables_at_its_own_hbm():
    h100 = build_stack(compose(["backend=sim", "hardware=h100", "model=llama2_7b"], logger="none")).time_model
    h200 = build_stack(compose(["backend=sim", "hardware=h200", "model=llama2_7b"], logger="none")).time_model
    assert h200.chosen.name == "op_profile" and h200.chosen.tables.hardware == "h100"
    assert h200.label == "auto -> op_profile (h100/llama2_7b tables, Vidur; h200 by rule)"
    assert "h100" in h200.describe()["priced_by"]["layers"] and "rule" in h200.describe()["pricing_rule"]
    ratios = []
    for tokens in (1, 8, 64, 4096):
        w = StepWork(num_tokens=tokens, num_seqs=1, prefill_tokens=tokens, num_sampled=1, attended=tokens,
                     context_tokens=tokens)
        ratios.append(h200.breakdown(w)["layers"] / h100.breakdown(w)["layers"])
    # decode-sized steps read the weights at HBM speed: faster by up to 4.8 / 3.35; a big prefill is compute-bound
    assert all(3.35 / 4.8 - 1e-9 <= r < 1 for r in ratios[:3]) and ratios[3] == pytest.approx(1, abs=0.05)


def test_the_rule_with_the_same_sheet_changes_nothing():
    sheet, cal = spec_sheet("h100"), Calibration.load()
    shape = build_stack(compose(["backend=sim", "model=llama2_7b"], logger="none")).executor.shape
    layer = GpuOps(sheet, cal).layer
    same = hbm_rescaled(lambda m: layer(m, shape, 1, 2, 2), shape, 1, sheet, sheet, cal, 2, 2)
    m = np.arange(1, 300, dtype=float)
    assert np.array_equal(same(m), layer(m, shape, 1, 2, 2))


def test_b200_is_roofline_only_and_says_so(tmp_path, capsys):
    cfg = compose(["backend=sim", "hardware=b200", "model=llama3_70b", "tensor_parallel_size=4",
                   "workload.num_requests=4"], logger="none", progress=False)
    summary = run_job(cfg, tmp_path, banner=True).summary
    assert summary["time_model"]["chosen"] == "calibrated_roofline"
    assert summary["time_model"]["pricing_rule"] == "roofline only, not validated"
    assert "priced as b200 (roofline only, not validated)" in capsys.readouterr().out
