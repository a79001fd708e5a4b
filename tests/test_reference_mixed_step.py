"""The torch reference attends a step that mixes decodes with prompt chunks exactly as it would
attend each sequence alone (decode rows are no longer padded to the longest chunk)."""

import pytest
import torch

from servelab.kernels import reference


@pytest.mark.parametrize("q_lens, ctx_lens", [([1, 37, 1, 5, 1], [20, 60, 100, 5, 33]), ([3, 1], [3, 70]),
                                              ([1, 1, 16], [9, 40, 16])])
def test_mixed_step_equals_each_sequence_alone(q_lens, ctx_lens):
    gen = torch.Generator().manual_seed(0)
    bs, kvh, heads, d = 16, 2, 4, 8
    blocks = [-(-c // bs) for c in ctx_lens]
    perm = torch.randperm(sum(blocks), generator=gen)
    tables = torch.zeros(len(blocks), max(blocks), dtype=torch.int32)
    for b, used in enumerate(torch.tensor([0, *blocks]).cumsum(0)[:-1].tolist()):
        tables[b, :blocks[b]] = perm[used:used + blocks[b]]
    k_cache = torch.randn(sum(blocks), bs, kvh, d, generator=gen)
    v_cache = torch.randn(sum(blocks), bs, kvh, d, generator=gen)
    q = torch.randn(sum(q_lens), heads, d, generator=gen)
    cu = torch.tensor([0, *q_lens]).cumsum(0).to(torch.int32)
    got = reference.paged_attention(q, k_cache, v_cache, tables, cu, torch.tensor(ctx_lens, dtype=torch.int32),
                                    max(q_lens), max(ctx_lens), d ** -0.5)
    for b, (ql, cl) in enumerate(zip(q_lens, ctx_lens)):
        alone = reference.paged_attention(q[cu[b]:cu[b + 1]], k_cache, v_cache, tables[b:b + 1],
                                          torch.tensor([0, ql], dtype=torch.int32),
                                          torch.tensor([cl], dtype=torch.int32), ql, cl, d ** -0.5)
        torch.testing.assert_close(got[cu[b]:cu[b + 1]], alone, rtol=1e-5, atol=1e-5)
