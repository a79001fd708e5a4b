"""Micro-benchmarks of the torch reference paged-cache ops on CPU (the CPU serving path).

    pytest benchmarks/bench_kernels.py --benchmark-only

(``--benchmark-only`` is needed because the project's pytest ``addopts`` has ``--benchmark-skip``.)
Shapes are a Llama-style 32 query / 8 KV heads of dim 128, fp32, block size 16.
"""

from __future__ import annotations

import pytest
import torch

from servelab.kernels import reference

NUM_HEADS, NUM_KV_HEADS, HEAD_DIM, BLOCK_SIZE = 32, 8, 128, 16


def paged_inputs(query_lens: list[int], context_lens: list[int], seed: int = 0) -> dict:
    """``reference.paged_attention`` keyword arguments with each sequence's blocks shuffled in the cache."""
    gen = torch.Generator().manual_seed(seed)
    blocks = [-(-c // BLOCK_SIZE) for c in context_lens]
    perm = torch.randperm(sum(blocks), generator=gen)
    tables = torch.zeros(len(blocks), max(blocks), dtype=torch.int64)
    used = 0
    for b, n in enumerate(blocks):
        tables[b, :n] = perm[used:used + n]
        used += n
    cache_shape = (sum(blocks), BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM)
    return dict(
        q=torch.randn(sum(query_lens), NUM_HEADS, HEAD_DIM, generator=gen),
        k_cache=torch.randn(cache_shape, generator=gen),
        v_cache=torch.randn(cache_shape, generator=gen),
        block_tables=tables,
        cu_seqlens_q=torch.tensor([0, *query_lens]).cumsum(0),
        context_lens=torch.tensor(context_lens),
        max_query_len=max(query_lens),
        max_context_len=max(context_lens),
        scale=HEAD_DIM**-0.5,
    )


@pytest.mark.parametrize("num_tokens", [16, 512])
def test_store_kv(benchmark, num_tokens):
    num_blocks = 2 * num_tokens // BLOCK_SIZE
    k_cache = torch.zeros(num_blocks, BLOCK_SIZE, NUM_KV_HEADS, HEAD_DIM)
    v_cache = torch.zeros_like(k_cache)
    key = torch.randn(num_tokens, NUM_KV_HEADS, HEAD_DIM)
    value = torch.randn_like(key)
    slots = torch.randperm(num_blocks * BLOCK_SIZE)[:num_tokens]
    slots[::7] = -1  # some tokens skipped, as for already-cached prefixes
    benchmark(reference.store_kv, key, value, k_cache, v_cache, slots)


@pytest.mark.parametrize("batch,context_len", [(1, 2048), (8, 512), (32, 256)])
def test_decode_attention(benchmark, batch, context_len):
    inputs = paged_inputs([1] * batch, [context_len - b for b in range(batch)])
    out = benchmark(reference.paged_attention, **inputs)
    assert out.shape == (batch, NUM_HEADS, HEAD_DIM)


@pytest.mark.parametrize("query_lens,context_lens", [([512], [512]), ([128, 128], [640, 1024]),
                                                    ([256, 1, 1, 1], [256, 300, 700, 1000])],
                         ids=["prompt512", "chunks-after-cache", "mixed"])
def test_prefill_attention(benchmark, query_lens, context_lens):
    inputs = paged_inputs(query_lens, context_lens)
    out = benchmark(reference.paged_attention, **inputs)
    assert out.shape == (sum(query_lens), NUM_HEADS, HEAD_DIM)
