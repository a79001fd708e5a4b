"""Quantisation in the simulator and the time models: weights and KV priced at their stored bytes."""

from __future__ import annotations

import pytest

from conftest import compose
from servelab.core.errors import ConfigError
from servelab.core.interfaces import TimeModelContext
from servelab.plugins.time_models.roofline import RooflineConfig, RooflineTime
from servelab.core.shapes import StorageBytes
from servelab.assemble.executor import build_sim_executor
from servelab.assemble.stack import build_stack
from servelab.core.step_work import StepWork


def sim(*overrides):
    return build_sim_executor(compose("backend=sim", "model=llama3_70b", *overrides))


def test_storage_bytes():
    assert StorageBytes.of("bfloat16") == StorageBytes(2, None, 2, 0.0)
    assert StorageBytes.of("bfloat16", "int8", "int8") == StorageBytes(2, 1.0, 1, 4)
    assert StorageBytes.of("float32", "none", "fp8_e4m3") == StorageBytes(4, None, 1, 4)
    with pytest.raises(ConfigError, match=r"model.quantization='int4' is not one of \['none', 'int8'\]"):
        StorageBytes.of("bfloat16", "int4")


def test_70b_int8_weights_fit_one_80gb_gpu_only_above_the_default_utilisation():
    """Weights: bf16 141 GB; INT8 72.7 GB (linears 1 byte + scales; embeddings and LM head bf16)."""
    bf16 = sim("tensor_parallel_size=4")
    int8 = sim("tensor_parallel_size=4", "model.quantization=int8")
    assert bf16.memory.weight_bytes * 4 == pytest.approx(141.1e9, rel=1e-3)
    assert int8.memory.weight_bytes * 4 == pytest.approx(72.7e9, rel=2e-3)
    with pytest.raises(ConfigError, match="the weights do not fit"):
        sim("model.quantization=int8")  # 72.7 + 2 GB reserve > 80 x 0.90
    one = sim("model.quantization=int8", "backend.gpu_memory_utilization=0.95")
    assert 0 < one.num_kv_blocks * one.bytes_per_block < 1.5e9  # it fits, with ~1.3 GB of KV left
    with pytest.raises(ConfigError, match="the weights do not fit"):
        sim("backend.gpu_memory_utilization=0.95")  # bf16 needs two
    two = sim("tensor_parallel_size=2", "backend.gpu_memory_utilization=0.95")
    assert two.num_kv_blocks > 0


def test_quantised_kv_doubles_the_70b_pool_less_the_scales():
    bf16 = sim("tensor_parallel_size=4", "model.quantization=int8")
    int8 = sim("tensor_parallel_size=4", "model.quantization=int8", "kv_cache_dtype=int8")
    fp8 = sim("tensor_parallel_size=4", "model.quantization=int8", "kv_cache_dtype=fp8_e4m3")
    assert int8.bytes_per_block == bf16.bytes_per_block * (128 + 4) / 256  # 1 byte per value + a 4-byte scale per head
    assert fp8.num_kv_blocks == int8.num_kv_blocks
    assert int8.num_kv_blocks / bf16.num_kv_blocks == pytest.approx(256 / 132, rel=1e-3)
    summary = int8.summary()
    assert summary["sim_kv_pool_bytes_per_rank"] == int8.num_kv_blocks * int8.bytes_per_block


def test_roofline_prices_int8_weights_and_kv_bytes():
    stack = build_stack(compose("backend=sim", "model=llama3_70b", "tensor_parallel_size=4", "num_kv_blocks=64"))
    ctx = stack.time_model.context
    cfg = RooflineConfig()
    decode = StepWork(num_tokens=8, num_seqs=8, decode_seqs=8, num_sampled=8, attended=8 * 1024,
                      context_tokens=8 * 1024)
    base = RooflineTime(cfg, ctx).predict(decode)
    w8 = TimeModelContext(ctx.shape, ctx.hardware, 4, "bfloat16", 2, 2, 16, linear_weight_bytes=1.0)
    w8kv8 = TimeModelContext(ctx.shape, ctx.hardware, 4, "bfloat16", 2, 1, 16, linear_weight_bytes=1.0,
                             kv_scale_bytes=4)
    t_w8, t_both = RooflineTime(cfg, w8).predict(decode), RooflineTime(cfg, w8kv8).predict(decode)
    assert 1.3 < base / t_w8 < 2.0  # bandwidth-bound decode: the seed's 1.3-1.8x
    assert t_both < t_w8  # less KV read per attended token
    assert w8kv8.kv_bytes_per_token == ctx.kv_bytes_per_token * 132 / 256


def test_summary_states_the_kv_pool_for_every_run_in_the_simulator():
    from servelab.run.session import run_job

    cfg = compose("backend=sim", "model=llama3_70b", "tensor_parallel_size=4", "model.quantization=int8",
                  "kv_cache_dtype=int8", "workload.num_requests=4")
    import tempfile

    with tempfile.TemporaryDirectory() as out:
        s = run_job(cfg, out).summary
    assert s["kv_pool_blocks"] > 0 and s["kv_pool_bytes"] == s["kv_pool_blocks"] * s["bytes_per_block"]
