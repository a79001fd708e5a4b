"""Model families and dtypes: Llama (incl. Llama-3 RoPE scaling), Mistral, Qwen2, Qwen3 against HF,
with the torch and the (interpreted) Triton attention backends."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import REPO, compose
from hf_reference import random_checkpoints_with_greedy
from servelab.api import LLM
from servelab.exec.model.random_checkpoint import write_random_checkpoint
from servelab.core.model_spec import CheckpointError, load_spec

BASE = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            vocab_size=256, max_position_embeddings=256)
FAMILIES = {
    "llama2": ("LlamaForCausalLM", {}),
    "llama3_rope": ("LlamaForCausalLM", dict(rope_parameters={
        "rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 32})),
    "mistral": ("MistralForCausalLM", dict(sliding_window=None)),
    "qwen2": ("Qwen2ForCausalLM", dict(tie_word_embeddings=True)),
    "qwen3": ("Qwen3ForCausalLM", dict(head_dim=24)),
}


@pytest.fixture(scope="module")
def family_checkpoints(tmp_path_factory):
    return random_checkpoints_with_greedy(tmp_path_factory.mktemp("families"), FAMILIES, BASE, 6)


def _overrides(path, backend="torch", block_size=16):
    return ["model=hf", f"model.path={path}", f"attention_backend={backend}", f"block_size={block_size}",
            "max_model_len=256", "max_num_batched_tokens=64", "max_num_seqs=4"]


@pytest.mark.parametrize("family", list(FAMILIES))
def test_torch_backend_equals_hf(family_checkpoints, family):
    checkpoints, prompts, max_tokens = family_checkpoints
    path, expected = checkpoints[family]
    lab = LLM(compose(*_overrides(path)))
    for p, n in zip(prompts, max_tokens):
        lab.add_request(p, n)
    while lab.has_unfinished():
        lab.step()
    assert [r["output_token_ids"] for r in lab.results().requests] == expected


@pytest.mark.slow
@pytest.mark.interpreted
def test_interpreted_triton_backend_equals_hf(family_checkpoints):
    """One fresh process per family: TRITON_INTERPRET=1 must be set before triton is imported."""
    checkpoints, prompts, max_tokens = family_checkpoints
    prompts, max_tokens = prompts[:3], [min(n, 4) for n in max_tokens[:3]]
    env = {**os.environ, "TRITON_INTERPRET": "1", "HF_HUB_OFFLINE": "1"}
    for family, (path, expected) in checkpoints.items():
        expected = [e[:n] for e, n in zip(expected, max_tokens)]
        spec = {"overrides": _overrides(path, "triton", 4 if family == "qwen3" else 16), "prompts": prompts,
                "max_tokens": max_tokens}
        proc = subprocess.run([sys.executable, str(REPO / "tests" / "run_stack_subprocess.py"), json.dumps(spec)],
                              env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        result = json.loads(proc.stdout.strip().splitlines()[-1])
        assert result["outputs"] == expected, family
        assert result["leaked_blocks"] == 0


def test_bfloat16_runs_and_mostly_agrees_with_float32(family_checkpoints):
    checkpoints, prompts, max_tokens = family_checkpoints
    path, expected = checkpoints["llama2"]
    lab = LLM(compose(*_overrides(path), "model.dtype=bfloat16"))
    for p, n in zip(prompts, max_tokens):
        lab.add_request(p, n)
    while lab.has_unfinished():
        lab.step()
    got = [r["output_token_ids"] for r in lab.results().requests]
    assert [len(g) for g in got] == [len(e) for e in expected]
    same = sum(a == b for g, e in zip(got, expected) for a, b in zip(g, e))
    assert same / sum(len(e) for e in expected) >= 0.5  # greedy paths may diverge after a near-tie


def test_unsupported_architecture_is_named(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"}))
    with pytest.raises(CheckpointError, match=r"GPT2LMHeadModel.*not supported; supported: LlamaForCausalLM"):
        load_spec(tmp_path)


def test_mistral_sliding_window_is_rejected_clearly(tmp_path):
    write_random_checkpoint(tmp_path, "MistralForCausalLM", **{**BASE, "sliding_window": 16})
    with pytest.raises(CheckpointError, match="sliding_window=16 is not supported"):
        load_spec(tmp_path)


def test_missing_tensor_is_named(tmp_path):
    from safetensors.torch import load_file, save_file

    write_random_checkpoint(tmp_path, "LlamaForCausalLM", **BASE)
    weights = load_file(tmp_path / "model.safetensors")
    del weights["model.layers.1.self_attn.k_proj.weight"]
    save_file(weights, tmp_path / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(CheckpointError, match=r"missing weights for layers\.1\.self_attn\.qkv_proj\.weight"):
        LLM(compose("model=hf", f"model.path={tmp_path}"))


def test_triton_without_cuda_or_interpreter_says_so(family_checkpoints, monkeypatch):
    from servelab.kernels.backend import AttentionBackendError, select_attention_backend
    import torch

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(AttentionBackendError, match="TRITON_INTERPRET=1"):
        select_attention_backend("triton", torch.device("cpu"))
