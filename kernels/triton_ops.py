"""Triton implementations of the paged-cache operations, drop-in for :mod:`servelab.kernels.reference`.

``store_kv`` and ``paged_attention`` have exactly the reference signatures and semantics (see that
module for the cache and varlen layouts). Supported configurations are checked by
:func:`check_supported`: block sizes that are powers of two from 1 to 256 and any head dim from 8 to
256 (non-powers of two such as 80 or 96 are padded inside the kernels). Inputs may be fp32, bf16 or
fp16; softmax and accumulation are fp32 and outputs have q's dtype.

Runs on CUDA, or on CPU tensors with ``TRITON_INTERPRET=1`` (Triton's interpreter; slow, for tests).
The interpreter setting is read at every launch, so it may be set after this module was imported.
"""

from __future__ import annotations

import torch

from .triton_decode import paged_decode_attention
from .triton_prefill import paged_prefill_attention
from .triton_store_kv import store_kv as _store_kv

SUPPORTED_BLOCK_SIZES = tuple(2**i for i in range(9))  # 1, 2, 4, ..., 256
MIN_HEAD_DIM, MAX_HEAD_DIM = 8, 256
SUPPORTED_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def check_supported(head_dim: int, block_size: int) -> None:
    """Raise ``ValueError`` unless the kernels support this head dim and cache block size.

    Supported: ``block_size`` a power of two in 1..256, ``head_dim`` any integer in 8..256.
    The message names the offending value and the supported set.
    """
    if block_size not in SUPPORTED_BLOCK_SIZES:
        raise ValueError(
            f"Triton attention does not support block_size={block_size}; "
            f"supported block sizes: {list(SUPPORTED_BLOCK_SIZES)} (powers of two from 1 to 256)"
        )
    if not (isinstance(head_dim, int) and MIN_HEAD_DIM <= head_dim <= MAX_HEAD_DIM):
        raise ValueError(
            f"Triton attention does not support head_dim={head_dim}; "
            f"supported head dims: any integer from {MIN_HEAD_DIM} to {MAX_HEAD_DIM}"
        )


def store_kv(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> None:
    """Write ``key``/``value`` ``[T, num_kv_heads, head_dim]`` into the cache slots ``slot_mapping[T]``.

    Contract of ``reference.store_kv``: slot ``-1`` means "do not store"; writes in place, casting to
    the cache dtype. ``slot_mapping`` is int32 or int64 on the caches' device; caches are
    ``[num_blocks, block_size, num_kv_heads, head_dim]`` with any strides.
    """
    _check_cache(k_cache, v_cache)
    _store_kv(key, value, k_cache, v_cache, slot_mapping, k_scale, v_scale)


def paged_attention(
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

    Contract of ``reference.paged_attention``. Sequence ``b`` owns query rows
    ``cu_seqlens_q[b]:cu_seqlens_q[b+1]``, the last ``q_len_b`` of its ``context_lens[b]`` cached
    tokens, read through ``block_tables[b]``. ``block_tables``, ``cu_seqlens_q`` and
    ``context_lens`` are int32 or int64 tensors on q's device; ``max_query_len`` /
    ``max_context_len`` must bound the true maxima (they size grids and splits without a device
    sync). ``H`` must be a multiple of ``num_kv_heads``. Decode batches (``max_query_len == 1`` and
    one token per sequence) use the split-K decode kernel, everything else the prefill kernel.
    ``k_scale``/``v_scale``: a quantised (INT8 / FP8) cache, see ``servelab.kernels.kv_quant``.
    """
    _check_cache(k_cache, v_cache)
    num_tokens, num_heads, _ = q.shape
    if q.dtype not in SUPPORTED_DTYPES:
        raise ValueError(f"Triton attention does not support dtype {q.dtype}; supported: {list(SUPPORTED_DTYPES)}")
    if num_heads % k_cache.shape[2]:
        raise ValueError(f"num_heads={num_heads} is not a multiple of num_kv_heads={k_cache.shape[2]}")
    if max_query_len == 1 and num_tokens == context_lens.shape[0]:
        return paged_decode_attention(q, k_cache, v_cache, block_tables, context_lens, max_context_len, scale,
                                      k_scale=k_scale, v_scale=v_scale)
    return paged_prefill_attention(
        q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, max_query_len, max_context_len, scale,
        k_scale, v_scale,
    )


def _check_cache(k_cache: torch.Tensor, v_cache: torch.Tensor) -> None:
    if k_cache.dim() != 4 or k_cache.shape != v_cache.shape:
        raise ValueError(
            "k_cache/v_cache must both be [num_blocks, block_size, num_kv_heads, head_dim]; "
            f"got {tuple(k_cache.shape)} and {tuple(v_cache.shape)}"
        )
    check_supported(k_cache.shape[3], k_cache.shape[1])
