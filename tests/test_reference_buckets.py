"""The torch paged path groups sequences by length; results must equal attending each one alone."""

from __future__ import annotations

import pytest
import torch

from servelab.kernels.reference import _length_buckets, contiguous_attention_reference, paged_attention


def _case(q_lens, ctx_lens, heads=4, kv_heads=2, dim=16, block_size=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    blocks_per_seq = [-(-c // block_size) for c in ctx_lens]
    num_blocks = sum(blocks_per_seq) + 3
    k_cache = torch.randn(num_blocks, block_size, kv_heads, dim, generator=g)
    v_cache = torch.randn(num_blocks, block_size, kv_heads, dim, generator=g)
    perm = torch.randperm(num_blocks, generator=g).tolist()  # scattered physical blocks
    tables = torch.zeros(len(ctx_lens), max(blocks_per_seq), dtype=torch.int32)
    for b, n in enumerate(blocks_per_seq):
        tables[b, :n] = torch.tensor([perm.pop() for _ in range(n)])
    q = torch.randn(sum(q_lens), heads, dim, generator=g)
    cu = torch.tensor([0] + list(torch.tensor(q_lens).cumsum(0)), dtype=torch.int32)
    return q, k_cache, v_cache, tables, cu, torch.tensor(ctx_lens, dtype=torch.int32)


def _oracle(q, k_cache, v_cache, tables, cu, ctx, scale):
    outs = []
    for b in range(len(ctx)):
        n = int(ctx[b])
        slots = torch.arange(n)
        phys = tables[b, slots // k_cache.shape[1]].long() * k_cache.shape[1] + slots % k_cache.shape[1]
        k = k_cache.reshape(-1, *k_cache.shape[2:])[phys]
        v = v_cache.reshape(-1, *v_cache.shape[2:])[phys]
        outs.append(contiguous_attention_reference(q[cu[b]:cu[b + 1]], k, v, scale))
    return torch.cat(outs)


@pytest.mark.parametrize("q_lens,ctx_lens", [
    ([1] * 24, [3 + 7 * i for i in range(24)]),                              # decode, 4 buckets
    ([1] * 16 + [5, 9, 2, 13, 7, 3], [40 - i for i in range(16)] + [5, 20, 2, 30, 7, 11]),  # mixed step
    ([6, 1, 9, 4, 12, 3, 8, 2], [6, 1, 9, 4, 12, 3, 8, 2]),                 # fresh prompts only
])
def test_bucketed_attention_equals_each_sequence_alone(q_lens, ctx_lens):
    q, k_cache, v_cache, tables, cu, ctx = _case(q_lens, ctx_lens)
    out = paged_attention(q, k_cache, v_cache, tables, cu, ctx, max(q_lens), max(ctx_lens), 0.25)
    torch.testing.assert_close(out, _oracle(q, k_cache, v_cache, tables, cu, ctx, 0.25), atol=1e-5, rtol=1e-5)


def test_buckets_cover_every_row_once_and_skip_uniform_batches():
    lengths = torch.tensor([50, 3, 17, 99, 8, 64, 2, 31, 70, 12, 5, 44, 90, 21, 60, 1])
    buckets = _length_buckets(lengths, min_rows=4)
    rows = torch.cat([r for r, _ in buckets]).sort().values
    assert rows.tolist() == list(range(16)) and len(buckets) == 4
    assert all(int(lengths[r].max()) == m for r, m in buckets)
    assert _length_buckets(torch.full((32,), 7))[0][0] is None  # nothing to gain: one group
