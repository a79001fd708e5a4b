"""Triton paged varlen causal prefill attention (prompt chunks, possibly after cached tokens).

Exact semantics of ``reference.paged_attention`` for any query lengths: query row ``i`` of sequence
``b`` sits at absolute position ``context_lens[b] - q_len_b + i`` and attends to cached keys
``0 ..= that position``. One program handles ``BLOCK_Q`` consecutive query rows of one sequence for
all query heads of one KV head: the tile's ``BLOCK_M = BLOCK_Q * BLOCK_G`` rows are (query row,
head in group) pairs, so each K/V tile, gathered through the block table ``BLOCK_N`` positions at a
time, is loaded once per GQA group. Softmax is online, in fp32.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .triton_decode import dot_config, scale_args
from .triton_paged import load_kv_tile
from .triton_store_kv import mode_aware_jit

_LOG2E = 1.4426950408889634


@mode_aware_jit
def _prefill_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, cu_seqlens_ptr, context_lens_ptr, out_ptr,
    k_scale_ptr, v_scale_ptr,
    scale_log2, num_groups, head_dim,
    stride_qt, stride_qh, stride_qd,
    stride_kb, stride_ks, stride_kh, stride_kd,
    stride_vb, stride_vs, stride_vh, stride_vd,
    stride_btb, stride_btn,
    stride_ot, stride_oh, stride_od,
    stride_ksb, stride_kss, stride_ksh,
    stride_vsb, stride_vss, stride_vsh,
    BLOCK_SIZE: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_G: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    DOT_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr, HAS_SCALE: tl.constexpr,
):
    BLOCK_M: tl.constexpr = BLOCK_Q * BLOCK_G
    q_tile = tl.program_id(0)
    seq = tl.program_id(1)
    kv_head = tl.program_id(2)

    q_start = tl.load(cu_seqlens_ptr + seq).to(tl.int32)
    q_len = tl.load(cu_seqlens_ptr + seq + 1).to(tl.int32) - q_start
    if q_tile * BLOCK_Q >= q_len:  # the grid covers max_query_len; shorter sequences stop early
        return
    context_len = tl.load(context_lens_ptr + seq).to(tl.int32)

    rows = tl.arange(0, BLOCK_M)
    q_row = q_tile * BLOCK_Q + rows // BLOCK_G
    group = rows % BLOCK_G
    heads = kv_head * num_groups + group
    dims = tl.arange(0, BLOCK_D)
    d_mask = dims < head_dim
    row_mask = (q_row < q_len) & (group < num_groups)
    q_offsets = (q_start + q_row)[:, None].to(tl.int64) * stride_qt + heads[:, None] * stride_qh
    q = tl.load(q_ptr + q_offsets + dims[None, :] * stride_qd,
                mask=row_mask[:, None] & d_mask[None, :], other=0.0).to(DOT_DTYPE)

    # Rows past q_len get positions >= context_len: finite scores, never stored.
    q_pos = context_len - q_len + q_row
    kv_end = context_len - q_len + tl.minimum((q_tile + 1) * BLOCK_Q, q_len)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    table_row = block_tables_ptr + seq.to(tl.int64) * stride_btb
    for start in range(0, kv_end, BLOCK_N):
        pos = start + tl.arange(0, BLOCK_N)
        n_mask = pos < kv_end
        k, v = load_kv_tile(
            k_cache_ptr, v_cache_ptr, k_scale_ptr, v_scale_ptr, table_row, pos, n_mask, kv_head, dims, d_mask,
            stride_kb, stride_ks, stride_kh, stride_kd, stride_vb, stride_vs, stride_vh, stride_vd, stride_btn,
            stride_ksb, stride_kss, stride_ksh, stride_vsb, stride_vss, stride_vsh,
            BLOCK_SIZE=BLOCK_SIZE, OUT_DTYPE=q_ptr.dtype.element_ty, DOT_DTYPE=DOT_DTYPE, HAS_SCALE=HAS_SCALE,
        )

        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale_log2  # [M, N], log2 domain
        # Key 0 is always allowed, so every row has a finite maximum after the first tile.
        allowed = (pos[None, :] <= q_pos[:, None]) & n_mask[None, :]
        s = tl.where(allowed, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(DOT_DTYPE), v, input_precision=DOT_PRECISION)
        m_i = m_new

    out = acc / l_i[:, None]
    out_offsets = (q_start + q_row)[:, None].to(tl.int64) * stride_ot + heads[:, None] * stride_oh
    tl.store(out_ptr + out_offsets + dims[None, :] * stride_od, out.to(out_ptr.dtype.element_ty),
             mask=row_mask[:, None] & d_mask[None, :])


def paged_prefill_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    context_lens: torch.Tensor,
    max_query_len: int,
    max_context_len: int,
    scale: float,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal varlen attention of ``q[T, H, d]`` over the paged cache; returns ``[T, H, d]`` in q's dtype.

    Same contract as ``reference.paged_attention`` (any ``max_query_len``, including sequences with
    ``q_len`` 0 or 1 in the batch): ``cu_seqlens_q[B+1]``, ``context_lens[B]`` and ``block_tables[B, n]``
    are int32 or int64 tensors on q's device (any strides), ``context_lens[b] >= q_len_b``, and
    ``max_query_len`` must be >= every ``q_len_b`` (it sizes the grid; rows beyond it are not computed).
    ``max_context_len`` is unused (kept for the common signature). Accumulates in fp32.
    """
    del max_context_len
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    num_groups = num_heads // num_kv_heads
    batch = context_lens.shape[0]
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    if num_tokens == 0 or batch == 0 or max_query_len == 0:
        return out

    block_d = max(16, triton.next_power_of_2(head_dim))
    block_g = triton.next_power_of_2(num_groups)
    target_m = 32 if block_d > 128 else 64
    block_q = max(1, target_m // block_g)  # BLOCK_M = block_q * block_g >= 16, as tl.dot needs
    block_n = 32 if block_d > 128 else 64
    grid = (triton.cdiv(max_query_len, block_q), batch, num_kv_heads)
    scales = scale_args(k_scale, v_scale, k_cache, v_cache)
    _prefill_kernel[grid](
        q, k_cache, v_cache, block_tables, cu_seqlens_q.contiguous(), context_lens.contiguous(), out,
        *scales[:2],
        scale * _LOG2E, num_groups, head_dim,
        *q.stride(), *k_cache.stride(), *v_cache.stride(), *block_tables.stride(), *out.stride(), *scales[2:],
        BLOCK_SIZE=k_cache.shape[1], BLOCK_Q=block_q, BLOCK_G=block_g, BLOCK_N=block_n, BLOCK_D=block_d,
        HAS_SCALE=k_scale is not None, **dot_config(q.dtype), num_warps=4, num_stages=2,
    )
    return out
