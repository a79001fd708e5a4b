"""Triton weight-only INT8 matmul: ``y[M, N] = (x[M, K] @ w_int8[N, K]^T) * scales[N]``.

The weights stay INT8 in memory (half the bytes of fp16/bf16, a quarter of fp32) and are widened to
the activation dtype tile by tile inside the kernel; products accumulate in fp32 and the
per-output-channel scale is applied once, after the reduction. Runs on CUDA, or on CPU tensors
with ``TRITON_INTERPRET=1`` (tests).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .triton_decode import dot_config
from .triton_store_kv import mode_aware_jit


@mode_aware_jit
def _int8_matmul_kernel(
    x_ptr, w_ptr, s_ptr, out_ptr, M, N, K,
    stride_xm, stride_xk, stride_wn, stride_wk, stride_om, stride_on,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
    DOT_DTYPE: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k_idx = k0 + ks
        x = tl.load(x_ptr + rows[:, None].to(tl.int64) * stride_xm + k_idx[None, :] * stride_xk,
                    mask=(rows[:, None] < M) & (k_idx[None, :] < K), other=0.0).to(DOT_DTYPE)
        w = tl.load(w_ptr + cols[None, :].to(tl.int64) * stride_wn + k_idx[:, None] * stride_wk,
                    mask=(cols[None, :] < N) & (k_idx[:, None] < K), other=0).to(DOT_DTYPE)  # [K, N]
        acc += tl.dot(x, w, input_precision=DOT_PRECISION)
    scales = tl.load(s_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)
    out = acc * scales[None, :]
    tl.store(out_ptr + rows[:, None].to(tl.int64) * stride_om + cols[None, :] * stride_on,
             out.to(out_ptr.dtype.element_ty), mask=(rows[:, None] < M) & (cols[None, :] < N))


def int8_matmul(x: torch.Tensor, weight: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """``x[M, K]`` (fp32/bf16/fp16) times ``weight[N, K]`` (int8) transposed, times ``scales[N]``; ``[M, N]`` in x's dtype."""
    m, k = x.shape
    n = weight.shape[0]
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    if m == 0:
        return out
    block_m = 16 if m <= 16 else 64
    block_n, block_k = 64, 64
    grid = (triton.cdiv(m, block_m), triton.cdiv(n, block_n))
    _int8_matmul_kernel[grid](
        x, weight, scales, out, m, n, k, *x.stride(), *weight.stride(), *out.stride(),
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, **dot_config(x.dtype),
        num_warps=4, num_stages=2,
    )
    return out
