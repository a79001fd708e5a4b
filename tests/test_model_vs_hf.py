"""Greedy tokens equal HF transformers' greedy generate of each prompt alone (float32)."""

from __future__ import annotations

import random

import pytest

from conftest import compose
from hf_reference import hf_greedy
from servelab.api import LLM


def _workload(vocab: int, n: int = 24, seed: int = 0):
    rng = random.Random(seed)
    prompts = [[rng.randrange(vocab) for _ in range(rng.randint(1, 90))] for _ in range(n)]
    max_tokens = [rng.randint(1, 24) for _ in prompts]
    return prompts, max_tokens


def _run(model_dir, prompts, max_tokens, *overrides):
    lab = LLM(compose("model=hf", f"model.path={model_dir}", "max_model_len=512", "max_num_seqs=8",
                      "max_num_batched_tokens=96", *overrides))
    for p, m in zip(prompts, max_tokens):
        lab.add_request(p, m)
    while lab.has_unfinished():
        lab.step()
    return lab.results()


@pytest.fixture(scope="module")
def references(checkpoint_dir):
    cache = {}

    def get(name):
        if name not in cache:
            path = checkpoint_dir(name)
            prompts, max_tokens = _workload(300 if "mha" in name else 256)
            cache[name] = (path, prompts, max_tokens, hf_greedy(path, prompts, max_tokens))
        return cache[name]

    return get


@pytest.mark.parametrize("name", ["llama_gqa_untied", "llama_mha_tied", "qwen2_bias_tied", "qwen2_mqa_untied"])
@pytest.mark.parametrize("block_size", [1, 16, 32])
def test_greedy_tokens_equal_hf(references, name, block_size):
    path, prompts, max_tokens, expected = references(name)
    result = _run(path, prompts, max_tokens, f"block_size={block_size}")
    got = [r["output_token_ids"] for r in result.requests]
    assert got == expected
    assert result.summary["leaked_blocks"] == 0
    assert result.summary["num_finished"] == len(prompts)


@pytest.mark.parametrize("name", ["llama_gqa_untied", "qwen2_bias_tied"])
@pytest.mark.parametrize("block_size,num_kv_blocks", [(1, 120), (16, 8), (32, 4)])
def test_preemption_with_recompute_keeps_tokens(references, name, block_size, num_kv_blocks):
    path, prompts, max_tokens, expected = references(name)
    result = _run(path, prompts, max_tokens, f"block_size={block_size}", f"num_kv_blocks={num_kv_blocks}")
    assert result.summary["num_preemptions"] > 0
    assert result.summary["num_preemptions_by_kind"] == {"recompute": result.summary["num_preemptions"]}
    assert [r["output_token_ids"] for r in result.requests] == expected
    assert result.summary["leaked_blocks"] == 0


def test_chunked_prefill_off_keeps_tokens(references):
    path, prompts, max_tokens, expected = references("llama_gqa_untied")
    result = _run(path, prompts, max_tokens, "chunked_prefill=false", "max_num_batched_tokens=512")
    assert [r["output_token_ids"] for r in result.requests] == expected
