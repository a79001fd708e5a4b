"""Quantised KV cache: K and V stored as INT8 or FP8 (E4M3) with one float32 scale per token and KV head.

Why per token and head: the cache is written one token at a time (``store_kv``), so a token's scale
is final when it is stored and no block is ever re-quantised when a later token of the same block
arrives with a larger magnitude (a per-block scale would need that, or a calibrated static scale).
The cost is 4 bytes per (token, KV head): 3 % of an INT8 head of 128 values, 12.5 % at head dim 32.

Scales live in tensors of shape ``[num_blocks, block_size, num_kv_heads]`` beside the caches
``[num_blocks, block_size, num_kv_heads, head_dim]``; slot ``s`` indexes both the same way.

Symmetric quantisation: ``scale = amax(|x|) / QMAX`` over the head's values (1 for an all-zero head),
``q = x / scale`` rounded half away from zero and clamped to ``[-127, 127]`` for INT8, cast
(round-to-nearest-even, saturating at 448) for FP8. Dequantised ``x' = q * scale``. The Triton
store kernel does the same arithmetic, so the two paths store the same bytes.
"""

from __future__ import annotations

import torch

KV_CACHE_DTYPES = ("auto", "int8", "fp8_e4m3")
SCALE_DTYPE = torch.float32
SCALE_BYTES = 4


class KVCacheDTypeError(ValueError):
    """A ``kv_cache_dtype`` this torch build or device cannot store."""


def kv_storage_dtype(name: str, compute_dtype: torch.dtype) -> torch.dtype:
    """The dtype the cache tensors have for ``kv_cache_dtype=name``."""
    if name == "auto":
        return compute_dtype
    if name == "int8":
        return torch.int8
    if name == "fp8_e4m3":
        dtype = getattr(torch, "float8_e4m3fn", None)
        if dtype is None:
            raise KVCacheDTypeError(f"kv_cache_dtype=fp8_e4m3: this torch build ({torch.__version__}) has no "
                                    "torch.float8_e4m3fn dtype; use kv_cache_dtype=int8 or auto")
        return dtype
    raise KVCacheDTypeError(f"kv_cache_dtype={name!r} is not one of {list(KV_CACHE_DTYPES)}")


def qmax(dtype: torch.dtype) -> float:
    """Largest representable magnitude used by the symmetric scale."""
    return 127.0 if dtype == torch.int8 else float(torch.finfo(dtype).max)


def round_half_away(x: torch.Tensor) -> torch.Tensor:
    """Round half away from zero (what the Triton kernel computes; ``torch.round`` rounds to even)."""
    return torch.sign(x) * torch.floor(x.abs() + 0.5)


def quantize_kv(x: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """``x[..., head_dim]`` -> (values in ``dtype``, float32 scales ``x.shape[:-1]``)."""
    limit = qmax(dtype)
    x = x.float()
    scale = x.abs().amax(-1) / limit
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    y = x / scale.unsqueeze(-1)
    if dtype == torch.int8:
        return round_half_away(y).clamp_(-limit, limit).to(torch.int8), scale
    return y.clamp_(-limit, limit).to(dtype), scale


def dequantize_kv(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Values ``q[..., head_dim]`` times their scales ``[...]``, in ``dtype``."""
    return (q.float() * scale.unsqueeze(-1)).to(dtype)


def bytes_view(t: torch.Tensor) -> torch.Tensor:
    """A uint8 view of a 1-byte cache, so indexing and copies work for FP8 on every device."""
    return t.view(torch.uint8) if t.element_size() == 1 and t.dtype != torch.uint8 else t
