"""Triton helper shared by the paged attention kernels: gathering one K/V tile through the block table.

Key position ``p`` of a sequence lives in physical block ``block_table[p // BLOCK_SIZE]`` at offset
``p % BLOCK_SIZE``. :func:`load_kv_tile` is inlined into the compiled kernels, so it costs no more
than writing its loads out in each kernel.
"""

from __future__ import annotations

import triton.language as tl

from .triton_store_kv import helper_jit


@helper_jit
def load_kv_tile(
    k_cache_ptr, v_cache_ptr, k_scale_ptr, v_scale_ptr, table_row, pos, n_mask, kv_head, dims, d_mask,
    stride_kb, stride_ks, stride_kh, stride_kd,
    stride_vb, stride_vs, stride_vh, stride_vd,
    stride_btn,
    stride_ksb, stride_kss, stride_ksh,
    stride_vsb, stride_vss, stride_vsh,
    BLOCK_SIZE: tl.constexpr, OUT_DTYPE: tl.constexpr, DOT_DTYPE: tl.constexpr, HAS_SCALE: tl.constexpr,
):
    """K and V ``[BLOCK_N, BLOCK_D]`` of ``kv_head`` at key positions ``pos``, as ``DOT_DTYPE``.

    ``n_mask`` marks the valid positions and ``d_mask`` the valid ``dims``; masked entries read 0.
    ``table_row`` points at the sequence's block-table row. With ``HAS_SCALE`` (a quantised cache)
    each position is dequantised by its per-(position, KV head) scale and rounded to ``OUT_DTYPE``
    (the queries' dtype) before the cast to ``DOT_DTYPE``.
    """
    block = tl.load(table_row + (pos // BLOCK_SIZE) * stride_btn, mask=n_mask, other=0).to(tl.int64)
    offset = (pos % BLOCK_SIZE).to(tl.int64)
    kv_mask = n_mask[:, None] & d_mask[None, :]
    k = tl.load(
        k_cache_ptr + block[:, None] * stride_kb + offset[:, None] * stride_ks
        + kv_head * stride_kh + dims[None, :] * stride_kd,
        mask=kv_mask, other=0.0,
    )
    v = tl.load(
        v_cache_ptr + block[:, None] * stride_vb + offset[:, None] * stride_vs
        + kv_head * stride_vh + dims[None, :] * stride_vd,
        mask=kv_mask, other=0.0,
    )
    if HAS_SCALE:  # quantised cache: one scale per (position, KV head)
        k_s = tl.load(k_scale_ptr + block * stride_ksb + offset * stride_kss + kv_head * stride_ksh,
                      mask=n_mask, other=0.0)
        v_s = tl.load(v_scale_ptr + block * stride_vsb + offset * stride_vss + kv_head * stride_vsh,
                      mask=n_mask, other=0.0)
        k = (k.to(tl.float32) * k_s[:, None]).to(OUT_DTYPE)
        v = (v.to(tl.float32) * v_s[:, None]).to(OUT_DTYPE)
    return k.to(DOT_DTYPE), v.to(DOT_DTYPE)
