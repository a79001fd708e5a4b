"""Quantisation (``model.quantization=int8``, ``kv_cache_dtype=int8|fp8_e4m3``): the arithmetic, the
kernels against each other, the pool sized in bytes, and policies that never change what the
quantised model computes."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from conftest import compose, serve_tiny_code
from servelab.core.packaged import PACKAGED_CHECKPOINTS
from servelab.core.errors import ConfigError
from servelab.kernels import reference
from servelab.kernels.kv_quant import dequantize_kv, kv_storage_dtype, quantize_kv
from servelab.exec.model.layers import TPGroup
from servelab.exec.model.loader import load_model
from servelab.exec.quant import (ROUND_TRIP_BOUND, Int8Weight, decoder_linears, dequantize_weight, quantize_model,
                            quantize_weight)
from servelab.assemble.stack import build_stack

REPO = Path(__file__).resolve().parents[1]
SETTINGS = {
    "w8": ["model.quantization=int8"],
    "kv8": ["kv_cache_dtype=int8"],
    "fp8": ["kv_cache_dtype=fp8_e4m3"],
    "w8kv8": ["model.quantization=int8", "kv_cache_dtype=int8"],
}


# ---- weights -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def tiny_code():
    return load_model(PACKAGED_CHECKPOINTS / "tiny_code", TPGroup(), torch.float32, torch.device("cpu"), 512)


def test_int8_round_trip_error_per_layer_is_within_half_a_step(tiny_code):
    """Every decoder linear of the trained model: ``|w - q * scale| <= amax(|row|) / 254``."""
    layers = list(decoder_linears(tiny_code))
    assert len(layers) == 4 * tiny_code.spec.num_layers  # qkv, o, gate_up, down
    for name, layer in layers:
        w = layer.weight.data
        q, scales = quantize_weight(w)
        assert q.dtype == torch.int8 and q.abs().max() <= 127 and scales.shape == (w.shape[0],)
        err = (w - dequantize_weight(q, scales)).abs().amax(1) / w.abs().amax(1)
        assert float(err.max()) <= ROUND_TRIP_BOUND * (1 + 1e-5), name
        assert float((w - dequantize_weight(q, scales)).norm() / w.norm()) < 0.01, name


def test_quantize_model_replaces_every_decoder_linear_and_keeps_embeddings(tiny_code):
    model = load_model(PACKAGED_CHECKPOINTS / "tiny_code", TPGroup(), torch.float32, torch.device("cpu"), 512)
    assert quantize_model(model, "int8", "dequant") == 4 * model.spec.num_layers
    assert all(layer.weight is None and layer.int8.qweight.dtype == torch.int8 for _, layer in decoder_linears(model))
    assert model.embed_tokens.weight.dtype == torch.float32  # embeddings / LM head stay in model.dtype
    with pytest.raises(ConfigError, match=r"model.quantization='int4' is not one of \['none', 'int8'\]"):
        quantize_model(model, "int4", "dequant")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_int8pack_and_dequant_matmuls_agree(dtype):
    torch.manual_seed(0)
    w, x = torch.randn(96, 64), torch.randn(5, 64)
    expected = x @ dequantize_weight(*quantize_weight(w)).T
    for kernel in ("int8pack", "dequant"):
        got = Int8Weight(w.to(dtype), kernel)(x.to(dtype)).float()
        tol = 1e-4 if dtype == torch.float32 else 0.05
        assert torch.allclose(got, expected, rtol=tol, atol=tol * expected.abs().max()), kernel


# ---- KV cache ------------------------------------------------------------------------------
@pytest.mark.parametrize("name, rel_bound", [("int8", 1 / 254), ("fp8_e4m3", 1 / 16)])
def test_kv_round_trip_bound(name, rel_bound):
    """INT8: half a step of amax/127; E4M3: 3 mantissa bits -> relative error <= 2^-4 of the value
    (of amax/448 * 2^-9 near zero, below the normals)."""
    torch.manual_seed(1)
    x = torch.randn(7, 3, 32) * torch.logspace(-3, 2, 7).view(-1, 1, 1)
    dtype = kv_storage_dtype(name, torch.float32)
    q, scale = quantize_kv(x, dtype)
    assert q.dtype == dtype and scale.shape == (7, 3)
    err = (dequantize_kv(q, scale, torch.float32) - x).abs()
    amax = x.abs().amax(-1, keepdim=True)
    bound = amax * rel_bound if name == "int8" else x.abs() * rel_bound + amax / 448 * 2 ** -9
    assert bool((err <= bound * (1 + 1e-5) + 1e-12).all())


@pytest.mark.parametrize("name", ["int8", "fp8_e4m3"])
def test_reference_store_then_attend_dequantises(name):
    torch.manual_seed(2)
    dtype = kv_storage_dtype(name, torch.float32)
    nb, bs, kvh, d, heads = 6, 4, 2, 16, 4
    k, v = torch.randn(10, kvh, d), torch.randn(10, kvh, d)
    slots = torch.tensor([0, 1, 2, 3, 4, 5, -1, 8, 9, 10])
    kc, vc = torch.zeros(nb, bs, kvh, d, dtype=dtype), torch.zeros(nb, bs, kvh, d, dtype=dtype)
    ks, vs = torch.zeros(nb, bs, kvh), torch.zeros(nb, bs, kvh)
    reference.store_kv(k, v, kc, vc, slots, ks, vs)
    fk, fv = torch.zeros(nb, bs, kvh, d), torch.zeros(nb, bs, kvh, d)
    reference.store_kv(k, v, fk, fv, slots)
    qk, sk = quantize_kv(k, dtype)
    assert torch.equal(reference.gather_kv(kc, torch.tensor([[0, 1]]), 6, ks, torch.float32)[0],
                       dequantize_kv(qk[:6], sk[:6], torch.float32))
    q = torch.randn(5, heads, d)
    args = (torch.tensor([[0, 1, 2], [2, 0, 1]]), torch.tensor([0, 4, 5]), torch.tensor([6, 3]), 4, 6, 0.25)
    quant = reference.paged_attention(q, kc, vc, *args, k_scale=ks, v_scale=vs)
    full = reference.paged_attention(q, fk, fv, *args)
    assert 0 < float((quant - full).abs().max()) < (0.05 if name == "int8" else 0.2)


def test_fp8_missing_from_the_torch_build_is_a_start_up_error(monkeypatch):
    monkeypatch.delattr(torch, "float8_e4m3fn")
    with pytest.raises(ConfigError, match=r"kv_cache_dtype=fp8_e4m3: this torch build .* has no torch.float8_e4m3fn"):
        build_stack(compose("kv_cache_dtype=fp8_e4m3", "num_kv_blocks=8"))


@pytest.mark.parametrize("bad, known", [("model.quantization=int4", r"\[none, int8\]"),
                                        ("kv_cache_dtype=fp16", r"\[auto, int8, fp8_e4m3\]")])
def test_unknown_names_list_the_known_ones(bad, known):
    with pytest.raises(ConfigError) as info:
        compose(bad)
    assert re.search(known, str(info.value))


# ---- the pool is sized in bytes ------------------------------------------------------------
@pytest.mark.parametrize("setting", ["auto", "int8", "fp8_e4m3"])
def test_the_same_budget_holds_proportionally_more_quantised_blocks(setting):
    stack = build_stack(compose(f"kv_cache_dtype={setting}", "backend.kv_cache_memory_gb=0.01", "block_size=16"))
    spec = stack.executor.spec
    per_head = spec.head_dim * 4 if setting == "auto" else spec.head_dim + 4  # fp32 values, or 1 byte + a scale
    per_block = 2 * spec.num_layers * 16 * spec.num_kv_heads * per_head
    assert stack.executor.bytes_per_block == per_block
    assert stack.executor.num_kv_blocks == int(0.01 * 2**30 // per_block)
    stack.executor.shutdown()


# ---- policies never change what the quantised model computes --------------------------------
_serve = serve_tiny_code


@pytest.fixture(scope="module")
def heldout():
    from test_trained_models import heldout_prompts

    return heldout_prompts(8, seed=5)


@pytest.fixture(scope="module")
def quantised_reference(heldout):
    prompts, max_tokens = heldout
    return {name: [r["output_token_ids"] for r in _serve(prompts, max_tokens, *overrides).requests]
            for name, overrides in SETTINGS.items()}


STACKS = {
    "whole": ["chunked_prefill=false", "max_num_batched_tokens=512", "max_model_len=512"],
    "chunked_prefix": ["allocator.prefix_caching=true", "max_num_batched_tokens=32"],
    "preempt_recompute": ["block_size=8", "num_kv_blocks=30"],
    "preempt_swap": ["block_size=8", "num_kv_blocks=30", "preemption=swap", "backend.num_swap_blocks=256"],
    "contiguous": ["allocator=contiguous", "max_num_seqs=3"],
}


@pytest.mark.parametrize("stack", list(STACKS))
@pytest.mark.parametrize("setting", ["w8kv8", "fp8"])
def test_quantised_tokens_are_the_same_on_every_stack(heldout, quantised_reference, setting, stack):
    prompts, max_tokens = heldout
    result = _serve(prompts, max_tokens, *SETTINGS[setting], *STACKS[stack])
    assert [r["output_token_ids"] for r in result.requests] == quantised_reference[setting]
    s = result.summary
    assert s["leaked_blocks"] == 0 and s["kv_pool_bytes"] == s["kv_pool_blocks"] * s["bytes_per_block"]
    if stack.startswith("preempt"):
        assert s["num_preemptions"] > 0
        if stack == "preempt_swap":
            assert s["swap_out_bytes"] > 0  # the scales travelled with the values: tokens are unchanged


@pytest.mark.slow
@pytest.mark.parametrize("stack", ["whole", "chunked_prefix", "preempt_swap"])  # the test above: all, on fcfs
@pytest.mark.parametrize("scheduler", ["fcfs", "static", "priority", "slo_aware"])
@pytest.mark.parametrize("setting", list(SETTINGS))
def test_quantised_tokens_every_scheduler_and_setting(heldout, quantised_reference, setting, scheduler, stack):
    prompts, max_tokens = heldout
    result = _serve(prompts, max_tokens, *SETTINGS[setting], *STACKS[stack], f"scheduler={scheduler}",
                    "slo.ttft_ms=500", "slo.tpot_ms=100")
    assert [r["output_token_ids"] for r in result.requests] == quantised_reference[setting]


@pytest.mark.parametrize("drafter", ["drafter=ngram", "drafter=draft_model"])
def test_speculative_decoding_keeps_quantised_tokens(heldout, quantised_reference, drafter):
    prompts, max_tokens = heldout
    result = _serve(prompts, max_tokens, *SETTINGS["w8kv8"], drafter, "drafter.k=4", "block_size=8",
                    "num_kv_blocks=40")
    assert [r["output_token_ids"] for r in result.requests] == quantised_reference["w8kv8"]
    assert result.summary["num_accepted_tokens"] > 0 and result.summary["leaked_blocks"] == 0


def test_tensor_parallel_int8_gives_the_tp1_tokens(heldout, quantised_reference):
    """Row-parallel shards share whole-row scales, so TP=2 stores TP=1's INT8 weights."""
    prompts, max_tokens = heldout
    result = _serve(prompts[:4], max_tokens[:4], *SETTINGS["w8kv8"], "tensor_parallel_size=2")
    assert [r["output_token_ids"] for r in result.requests] == quantised_reference["w8kv8"][:4]


@pytest.mark.slow
@pytest.mark.interpreted
def test_quantised_triton_path_agrees_with_torch_path(heldout, quantised_reference):
    """The Triton INT8 matmul, quantising store and dequantising attention kernels (interpreted, in a
    fresh process: TRITON_INTERPRET=1 must be set before triton is imported) give the torch path's tokens."""
    pytest.importorskip("triton")
    prompts, max_tokens = heldout
    prompts, max_tokens = prompts[:3], [min(n, 6) for n in max_tokens[:3]]
    env = {**os.environ, "TRITON_INTERPRET": "1", "HF_HUB_OFFLINE": "1"}
    for setting in ("w8kv8", "fp8"):
        spec = {"overrides": ["model=tiny_code", "attention_backend=triton", "block_size=16",
                              "max_num_batched_tokens=128", *SETTINGS[setting]],
                "prompts": prompts, "max_tokens": max_tokens}
        proc = subprocess.run([sys.executable, str(REPO / "tests" / "run_stack_subprocess.py"), json.dumps(spec)],
                              env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        outputs = json.loads(proc.stdout.strip().splitlines()[-1])["outputs"]
        expected = [e[:n] for e, n in zip(quantised_reference[setting][:3], max_tokens)]
        assert outputs == expected, setting


def test_linear_kernel_choice():
    from servelab.exec.quant import linear_kernel

    cpu = torch.device("cpu")
    assert linear_kernel("triton", cpu, torch.float32) == "triton"
    assert linear_kernel("torch", cpu, torch.bfloat16) == "int8pack"  # torch's fast weight-only kernel
    assert linear_kernel("torch", cpu, torch.float32) == "dequant"  # its float32 path is a slow fallback


def test_bfloat16_int8_runs_through_int8pack_and_mostly_agrees(heldout, quantised_reference):
    prompts, max_tokens = heldout
    lab_result = _serve(prompts[:4], max_tokens[:4], *SETTINGS["w8kv8"], "model.dtype=bfloat16")
    got = [r["output_token_ids"] for r in lab_result.requests]
    expected = quantised_reference["w8kv8"][:4]
    same = sum(a == b for g, e in zip(got, expected) for a, b in zip(g, e))
    assert same / sum(len(e) for e in expected) >= 0.5  # bfloat16 rounding may flip a near-tie, then diverge


def test_the_banner_says_what_is_quantised(tmp_path):
    from servelab.results.banner import banner_lines

    cfg = compose("model.quantization=int8", "kv_cache_dtype=fp8_e4m3", "num_kv_blocks=8")
    stack = build_stack(cfg)
    rows = dict(banner_lines(cfg, stack, tmp_path, "off"))
    stack.executor.shutdown()
    assert "int8 decoder linears (embeddings and LM head in float32)" in rows["model"]
    assert "fp8_e4m3 values + a float32 scale per token and KV head" in rows["KV pool"]
