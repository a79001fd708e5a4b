"""Triton paged decode attention: one query token per sequence, K/V read through the block table.

One program handles one (sequence, KV head, context split): it loads the queries of all
``num_heads // num_kv_heads`` heads sharing that KV head as one ``[BLOCK_G, BLOCK_D]`` tile, so each
K/V tile is read once per group, and runs an fp32 online softmax over ``BLOCK_N`` key positions at a
time. Key position ``p`` is fetched from physical block ``block_table[p // block_size]`` at offset
``p % block_size`` per position, which makes every block size (and any block table contents,
including blocks shared between sequences) the same code path.

Long contexts with too few (sequence, KV head) pairs to fill the GPU are split over the context
(flash-decoding): each split writes a normalised partial output and its log-sum-exp, and a second
kernel merges the splits. :func:`choose_num_splits` is the heuristic. The split count is a runtime
argument, not a ``constexpr``, so changing batch sizes and lengths do not trigger recompilation.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .triton_paged import load_kv_tile
from .triton_store_kv import mode_aware_jit

_LOG2E = 1.4426950408889634

# Split-K heuristic knobs (see choose_num_splits).
MIN_KEYS_PER_SPLIT = 256
MAX_SPLITS = 32
_CPU_PROGRAM_TARGET = 64  # stands in for 2 x SM count when there is no CUDA device (interpreter)


@mode_aware_jit
def _decode_kernel(
    q_ptr, k_cache_ptr, v_cache_ptr, block_tables_ptr, context_lens_ptr,
    out_ptr, part_out_ptr, part_lse_ptr, k_scale_ptr, v_scale_ptr,
    scale_log2, num_groups, head_dim, keys_per_split, num_splits,
    stride_qb, stride_qh, stride_qd,
    stride_kb, stride_ks, stride_kh, stride_kd,
    stride_vb, stride_vs, stride_vh, stride_vd,
    stride_btb, stride_btn,
    stride_ob, stride_oh, stride_od,
    stride_ksb, stride_kss, stride_ksh,
    stride_vsb, stride_vss, stride_vsh,
    BLOCK_SIZE: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
    SPLIT_K: tl.constexpr, DOT_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr, HAS_SCALE: tl.constexpr,
):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)

    groups = tl.arange(0, BLOCK_G)
    dims = tl.arange(0, BLOCK_D)
    heads = kv_head * num_groups + groups
    g_mask = groups < num_groups
    d_mask = dims < head_dim

    q = tl.load(
        q_ptr + seq * stride_qb + heads[:, None] * stride_qh + dims[None, :] * stride_qd,
        mask=g_mask[:, None] & d_mask[None, :], other=0.0,
    ).to(DOT_DTYPE)

    context_len = tl.load(context_lens_ptr + seq).to(tl.int32)
    split_start = split * keys_per_split
    split_end = tl.minimum(split_start + keys_per_split, context_len)

    m_i = tl.full([BLOCK_G], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
    table_row = block_tables_ptr + seq.to(tl.int64) * stride_btb
    for start in range(split_start, split_end, BLOCK_N):
        pos = start + tl.arange(0, BLOCK_N)
        n_mask = pos < split_end
        k, v = load_kv_tile(
            k_cache_ptr, v_cache_ptr, k_scale_ptr, v_scale_ptr, table_row, pos, n_mask, kv_head, dims, d_mask,
            stride_kb, stride_ks, stride_kh, stride_kd, stride_vb, stride_vs, stride_vh, stride_vd, stride_btn,
            stride_ksb, stride_kss, stride_ksh, stride_vsb, stride_vss, stride_vsh,
            BLOCK_SIZE=BLOCK_SIZE, OUT_DTYPE=q_ptr.dtype.element_ty, DOT_DTYPE=DOT_DTYPE, HAS_SCALE=HAS_SCALE,
        )

        s = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * scale_log2  # [G, N], log2 domain
        s = tl.where(n_mask[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(DOT_DTYPE), v, input_precision=DOT_PRECISION)
        m_i = m_new

    out_mask = g_mask[:, None] & d_mask[None, :]
    if not SPLIT_K:
        out = acc / l_i[:, None]
        tl.store(
            out_ptr + seq * stride_ob + heads[:, None] * stride_oh + dims[None, :] * stride_od,
            out.to(out_ptr.dtype.element_ty), mask=out_mask,
        )
    else:
        # Partials are [B, H, num_splits, BLOCK_D] fp32 and lse [B, H, num_splits] (log2 units), contiguous.
        # An empty split stores out 0 and lse -inf, i.e. weight 0 in the merge.
        empty = l_i == 0.0
        out = acc / tl.where(empty, 1.0, l_i)[:, None]
        lse = tl.where(empty, float("-inf"), m_i + tl.log2(tl.where(empty, 1.0, l_i)))
        row = (seq * tl.num_programs(1) * num_groups + heads) * num_splits + split
        tl.store(part_out_ptr + row[:, None] * BLOCK_D + dims[None, :], out, mask=out_mask)
        tl.store(part_lse_ptr + row, lse, mask=g_mask)


@mode_aware_jit
def _merge_splits_kernel(
    part_out_ptr, part_lse_ptr, out_ptr, head_dim, num_splits,
    stride_ob, stride_oh, stride_od,
    BLOCK_S: tl.constexpr, BLOCK_D: tl.constexpr,
):
    # One program per (sequence, query head): weight each split by exp2(lse_s - max lse).
    seq = tl.program_id(0)
    head = tl.program_id(1)
    row = seq * tl.num_programs(1) + head
    splits = tl.arange(0, BLOCK_S)
    dims = tl.arange(0, BLOCK_D)
    s_mask = splits < num_splits
    d_mask = dims < head_dim
    lse = tl.load(part_lse_ptr + row * num_splits + splits, mask=s_mask, other=float("-inf"))
    weights = tl.exp2(lse - tl.max(lse, 0))
    parts = tl.load(
        part_out_ptr + (row * num_splits + splits[:, None]) * BLOCK_D + dims[None, :],
        mask=s_mask[:, None] & d_mask[None, :], other=0.0,
    )
    out = tl.sum(parts * weights[:, None], 0) / tl.sum(weights, 0)
    tl.store(out_ptr + seq * stride_ob + head * stride_oh + dims * stride_od,
             out.to(out_ptr.dtype.element_ty), mask=d_mask)


def dot_config(dtype: torch.dtype) -> dict:
    """``tl.dot`` operand dtype and precision for attention inputs of ``dtype``.

    fp32 uses exact ("ieee") products, not TF32, to match the torch path. Triton 3.x's CPU
    interpreter multiplies bf16 operands as raw 16-bit integers, so interpreted bf16 runs in fp32.
    """
    interpret = bool(triton.knobs.runtime.interpret)
    if dtype == torch.float32 or (dtype == torch.bfloat16 and interpret):
        return {"DOT_DTYPE": tl.float32, "DOT_PRECISION": "ieee"}
    return {"DOT_DTYPE": tl.bfloat16 if dtype == torch.bfloat16 else tl.float16, "DOT_PRECISION": None}


def scale_args(k_scale, v_scale, k_cache, v_cache) -> tuple:
    """Kernel arguments for the scale tensors: two pointers then six strides (placeholders without scales)."""
    if k_scale is None:
        return (k_cache, v_cache) + (0,) * 6
    return (k_scale, v_scale, *k_scale.stride(), *v_scale.stride())


def choose_num_splits(batch: int, num_kv_heads: int, max_context_len: int, num_sms: int | None) -> int:
    """How many context splits decode should use; 1 means a single pass without the merge kernel.

    Aim for about two programs per SM (``num_sms=None``: a fixed target of 64 programs): split only
    when ``batch * num_kv_heads`` falls short of that, never into splits shorter than
    ``MIN_KEYS_PER_SPLIT`` keys of ``max_context_len``, and at most ``MAX_SPLITS``.
    """
    target = 2 * num_sms if num_sms else _CPU_PROGRAM_TARGET
    pairs = max(1, batch * num_kv_heads)
    if pairs >= target:
        return 1
    by_occupancy = triton.cdiv(target, pairs)
    by_length = max(1, max_context_len // MIN_KEYS_PER_SPLIT)
    return max(1, min(by_occupancy, by_length, MAX_SPLITS))


def _num_sms(device: torch.device) -> int | None:
    if device.type != "cuda":
        return None
    return torch.cuda.get_device_properties(device).multi_processor_count


def paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    max_context_len: int,
    scale: float,
    num_splits: int | None = None,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """Decode attention of ``q[B, H, d]`` (one token per sequence) over the paged cache; returns ``[B, H, d]``.

    Same contract as ``reference.paged_decode_attention``: sequence ``b`` attends to its first
    ``context_lens[b]`` (>= 1) cached tokens through ``block_tables[b]``; ``H`` is a multiple of the
    cache's ``num_kv_heads``. ``block_tables`` ``[B, >= ceil(max_context_len / block_size)]`` and
    ``context_lens`` ``[B]`` are int32 or int64 tensors on q's device, any strides; entries of
    ``block_tables`` past a sequence's length are never read. Caches may have any strides and a
    dtype other than q's (K/V are cast to q's dtype). Accumulates in fp32; the output has q's dtype.
    ``num_splits`` overrides :func:`choose_num_splits` (which uses ``max_context_len``).
    ``k_scale``/``v_scale`` (``[num_blocks, block_size, num_kv_heads]``): a quantised cache, dequantised
    per position as it is read (``kv_quant.dequantize_kv``).
    """
    batch, num_heads, head_dim = q.shape
    num_kv_heads = k_cache.shape[2]
    num_groups = num_heads // num_kv_heads
    out = torch.empty_like(q, memory_format=torch.contiguous_format)
    if batch == 0:
        return out
    if num_splits is None:
        num_splits = choose_num_splits(batch, num_kv_heads, max_context_len, _num_sms(q.device))

    block_d = max(16, triton.next_power_of_2(head_dim))  # tl.dot needs every dimension >= 16
    block_g = max(16, triton.next_power_of_2(num_groups))
    block_n = 32 if block_d > 128 else 64
    keys_per_split = triton.cdiv(triton.cdiv(max(max_context_len, 1), num_splits), block_n) * block_n
    if num_splits > 1:
        part_out = torch.empty(batch, num_heads, num_splits, block_d, dtype=torch.float32, device=q.device)
        part_lse = torch.empty(batch, num_heads, num_splits, dtype=torch.float32, device=q.device)
    else:
        part_out = part_lse = out  # unused
    _decode_kernel[(batch, num_kv_heads, num_splits)](
        q, k_cache, v_cache, block_tables, context_lens.contiguous(),
        out, part_out, part_lse, *scale_args(k_scale, v_scale, k_cache, v_cache)[:2],
        scale * _LOG2E, num_groups, head_dim, keys_per_split, num_splits,
        *q.stride(), *k_cache.stride(), *v_cache.stride(), *block_tables.stride(), *out.stride(),
        *scale_args(k_scale, v_scale, k_cache, v_cache)[2:],
        BLOCK_SIZE=k_cache.shape[1], BLOCK_G=block_g, BLOCK_N=block_n, BLOCK_D=block_d,
        SPLIT_K=num_splits > 1, HAS_SCALE=k_scale is not None, **dot_config(q.dtype),
        num_warps=4, num_stages=2,
    )
    if num_splits > 1:
        _merge_splits_kernel[(batch, num_heads)](
            part_out, part_lse, out, head_dim, num_splits, *out.stride(),
            BLOCK_S=triton.next_power_of_2(max(num_splits, MAX_SPLITS)), BLOCK_D=block_d,
        )
    return out
