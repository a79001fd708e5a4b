"""Triton kernel writing a step's new keys/values into the paged KV cache (see ``reference.store_kv``).

Also home of :func:`mode_aware_jit` and :func:`helper_jit`, shared by the other Triton kernel
modules: ``@triton.jit`` decides between compiled and interpreted execution from ``TRITON_INTERPRET``
when the decorator runs, so a kernel module imported before the variable was set would stay compiled
(and fail on CPU tensors). ``mode_aware_jit`` decorates at import, as ``triton.jit`` does, and
re-decorates at launch if the variable has changed since. Triton's own ``tl.*`` helpers written in
Triton (``tl.sum``, ``tl.max``, ...) are decorated once, when ``triton`` is first imported, so
interpreting additionally needs ``TRITON_INTERPRET=1`` set before that first import (see
:func:`interpreter_available`); ``helper_jit`` decorates the kernels' own helpers the same way.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
import triton.language.standard as _tl_standard
from triton.runtime.interpreter import InterpretedFunction
from triton.runtime.jit import JITFunction

from .kv_quant import qmax


def interpreter_available() -> bool:
    """Whether this process can interpret kernels: ``TRITON_INTERPRET=1`` was set when triton was imported."""
    return isinstance(_tl_standard.sum, InterpretedFunction)


class _ModeAwareKernel:
    """A ``@triton.jit`` kernel that follows the current ``TRITON_INTERPRET`` setting at launch."""

    def __init__(self, fn):
        self.fn = fn
        self._by_mode: dict[bool, object] = {}
        self.current()

    def current(self):
        """The compiled (``JITFunction``) or interpreted (``InterpretedFunction``) kernel for now."""
        interpret = bool(triton.knobs.runtime.interpret)
        kernel = self._by_mode.get(interpret)
        if kernel is None:
            kernel = self._by_mode[interpret] = triton.jit(self.fn)
        return kernel

    def __getitem__(self, grid):
        interpret = bool(triton.knobs.runtime.interpret)
        if interpret != interpreter_available():
            raise RuntimeError(
                f"TRITON_INTERPRET is {'1' if interpret else 'unset'} now but was "
                f"{'1' if not interpret else 'unset'} when `triton` was first imported; Triton builds its "
                "tl.* helpers for one mode at import, so set TRITON_INTERPRET before importing triton"
            )
        return self.current()[grid]


def mode_aware_jit(fn) -> _ModeAwareKernel:
    """Decorator: like ``triton.jit`` but re-reads ``TRITON_INTERPRET`` at every launch.

    The kernel may call ``tl.*`` functions and helpers decorated with :func:`helper_jit`, but no plain
    ``@triton.jit`` helpers (those would keep the mode ``TRITON_INTERPRET`` had at their import).
    """
    return _ModeAwareKernel(fn)


def helper_jit(fn):
    """Decorator for ``@triton.jit`` helpers that :func:`mode_aware_jit` kernels call.

    Compiled kernels inline such a helper; interpreted kernels call it as Python. Kernels launch only
    in the mode ``triton`` was imported in (``_ModeAwareKernel.__getitem__``), so the helper is built
    for that mode, as Triton's own ``tl.*`` helpers are, whatever ``TRITON_INTERPRET`` is when its
    module is imported.
    """
    return InterpretedFunction(fn) if interpreter_available() else JITFunction(fn)


@mode_aware_jit
def _store_kv_kernel(
    key_ptr, value_ptr, k_cache_ptr, v_cache_ptr, slot_ptr, k_scale_ptr, v_scale_ptr,
    num_kv_heads, head_dim, block_size,
    stride_kt, stride_kh, stride_kd,
    stride_vt, stride_vh, stride_vd,
    stride_kcb, stride_kcs, stride_kch, stride_kcd,
    stride_vcb, stride_vcs, stride_vch, stride_vcd,
    stride_ksb, stride_kss, stride_ksh,
    stride_vsb, stride_vss, stride_vsh,
    BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
    QUANT: tl.constexpr, IS_INT8: tl.constexpr, QMAX: tl.constexpr,
):
    # One program per (token, group of BLOCK_H kv heads).
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + token).to(tl.int64)
    block = slot // block_size
    offset = slot % block_size
    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    dims = tl.arange(0, BLOCK_D)
    # Skipped slots get an empty head range (combining a block mask with a scalar condition via
    # `&` yields an int32 mask in the 3.x interpreter, which tl.load rejects).
    heads_limit = tl.where(slot >= 0, num_kv_heads, 0)
    mask = (heads[:, None] < heads_limit) & (dims[None, :] < head_dim)

    src_k = key_ptr + token * stride_kt + heads[:, None] * stride_kh + dims[None, :] * stride_kd
    src_v = value_ptr + token * stride_vt + heads[:, None] * stride_vh + dims[None, :] * stride_vd
    dst_k = (k_cache_ptr + block * stride_kcb + offset * stride_kcs
             + heads[:, None] * stride_kch + dims[None, :] * stride_kcd)
    dst_v = (v_cache_ptr + block * stride_vcb + offset * stride_vcs
             + heads[:, None] * stride_vch + dims[None, :] * stride_vcd)
    k = tl.load(src_k, mask=mask, other=0.0)
    v = tl.load(src_v, mask=mask, other=0.0)
    if QUANT:
        # Same arithmetic as servelab.kernels.kv_quant.quantize_kv (one scale per token and head).
        h_mask = heads < heads_limit
        kf = k.to(tl.float32)
        vf = v.to(tl.float32)
        k_s = tl.max(tl.abs(kf), 1) / QMAX
        v_s = tl.max(tl.abs(vf), 1) / QMAX
        k_s = tl.where(k_s > 0, k_s, 1.0)
        v_s = tl.where(v_s > 0, v_s, 1.0)
        kq = kf / k_s[:, None]
        vq = vf / v_s[:, None]
        if IS_INT8:
            kq = tl.where(kq >= 0, tl.floor(kq + 0.5), -tl.floor(-kq + 0.5))
            vq = tl.where(vq >= 0, tl.floor(vq + 0.5), -tl.floor(-vq + 0.5))
        else:
            # Round to the nearest E4M3 value (ties to even) here, so the cast below is exact: Triton's
            # CPU interpreter rounds fp32 -> fp8 wrongly where rounding up carries into the exponent.
            # The grid step is 2^(exponent - 3) (3 mantissa bits), 2^-9 below the smallest normal 2^-6.
            k_step = ((tl.maximum(((kq.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127, -6) + 124) << 23
                      ).to(tl.float32, bitcast=True)
            v_step = ((tl.maximum(((vq.to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127, -6) + 124) << 23
                      ).to(tl.float32, bitcast=True)
            k_t = kq / k_step
            v_t = vq / v_step
            k_r = tl.floor(k_t + 0.5)
            v_r = tl.floor(v_t + 0.5)
            k_r = tl.where(((k_r - k_t) == 0.5) & ((k_r - 2.0 * tl.floor(k_r * 0.5)) != 0.0), k_r - 1.0, k_r)
            v_r = tl.where(((v_r - v_t) == 0.5) & ((v_r - 2.0 * tl.floor(v_r * 0.5)) != 0.0), v_r - 1.0, v_r)
            kq = tl.where(k_r == 0.0, k_t * 0.0, k_r * k_step)  # t * 0 keeps the sign of a rounded-away value
            vq = tl.where(v_r == 0.0, v_t * 0.0, v_r * v_step)
        kq = tl.minimum(tl.maximum(kq, -QMAX), QMAX)
        vq = tl.minimum(tl.maximum(vq, -QMAX), QMAX)
        tl.store(dst_k, kq.to(k_cache_ptr.dtype.element_ty), mask=mask)
        tl.store(dst_v, vq.to(v_cache_ptr.dtype.element_ty), mask=mask)
        tl.store(k_scale_ptr + block * stride_ksb + offset * stride_kss + heads * stride_ksh, k_s, mask=h_mask)
        tl.store(v_scale_ptr + block * stride_vsb + offset * stride_vss + heads * stride_vsh, v_s, mask=h_mask)
    else:
        tl.store(dst_k, k.to(k_cache_ptr.dtype.element_ty), mask=mask)
        tl.store(dst_v, v.to(v_cache_ptr.dtype.element_ty), mask=mask)


# Elements one program moves per tensor; bounds registers when num_kv_heads * head_dim is large.
_MAX_TILE_ELEMENTS = 2048


def store_kv(
    key: torch.Tensor,
    value: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    k_scale: torch.Tensor | None = None,
    v_scale: torch.Tensor | None = None,
) -> None:
    """Write ``key``/``value`` ``[T, num_kv_heads, head_dim]`` into cache slots ``slot_mapping[T]``, in place.

    Same contract as ``reference.store_kv``: the caches are ``[num_blocks, block_size, num_kv_heads,
    head_dim]`` (any strides), slot ``s`` is block ``s // block_size`` offset ``s % block_size``, and
    slot ``-1`` skips the token. ``slot_mapping`` is an int32 or int64 tensor on the caches' device;
    values are cast to the cache dtype. Duplicate slots: one of the writers wins, unspecified which.
    With ``k_scale``/``v_scale`` (``[num_blocks, block_size, num_kv_heads]`` float32) the values are
    quantised exactly as ``kv_quant.quantize_kv`` does and their scales stored.
    """
    num_tokens, num_kv_heads, head_dim = key.shape
    if num_tokens == 0:
        return
    block_d = triton.next_power_of_2(head_dim)
    block_h = min(triton.next_power_of_2(num_kv_heads), max(1, _MAX_TILE_ELEMENTS // block_d))
    grid = (num_tokens, triton.cdiv(num_kv_heads, block_h))
    quant = k_scale is not None
    if k_scale is not None:
        assert v_scale is not None, "k_scale and v_scale come together"
        scale_strides = (*k_scale.stride(), *v_scale.stride())
    else:
        scale_strides = (0,) * 6
    _store_kv_kernel[grid](
        key, value, k_cache, v_cache, slot_mapping.contiguous(),
        k_scale if quant else k_cache, v_scale if quant else v_cache,
        num_kv_heads, head_dim, k_cache.shape[1],
        *key.stride(), *value.stride(), *k_cache.stride(), *v_cache.stride(), *scale_strides,
        BLOCK_H=block_h, BLOCK_D=block_d,
        QUANT=quant, IS_INT8=k_cache.dtype == torch.int8, QMAX=qmax(k_cache.dtype) if quant else 1.0,
    )
