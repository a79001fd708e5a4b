"""Quantisation as a memory policy: weight-only INT8 linears (``model.quantization``) and the KV
cache's storage dtype (``kv_cache_dtype``).

``model.quantization=int8`` quantises, at load time and after tensor-parallel sharding, the weight
of every decoder linear layer (the fused q/k/v, o, the fused gate/up, down) to INT8 with one
symmetric scale per output channel (row): ``scale = amax(|row|) / 127``, ``q = round(w / scale)``
(half away from zero). A row-parallel layer's rank holds a slice of each row; the ranks exchange
their slices' maxima at load time, so every ``tensor_parallel_size`` stores the same INT8 values
and scales as TP=1 (column-parallel rows are whole on one rank already). Embeddings, the LM head and
the norms stay in ``model.dtype``. Round trip: every element is within ``scale / 2`` of the
original, i.e. ``|w - q * scale| <= amax(|row|) / 254`` (:data:`ROUND_TRIP_BOUND`).

The matmul: ``attention_backend=triton`` (CUDA, or the interpreter in tests) runs
:mod:`servelab.kernels.triton_int8_matmul`; otherwise torch's weight-only INT8 kernel
``aten._weight_int8pack_mm`` when it runs for this device and dtype (CPU: bfloat16, float16),
else each call dequantises the layer's weight (logged at start-up): that includes float32 on CPU,
where torch's int8pack path is a slow scalar fallback (see :func:`linear_kernel`).
"""

from __future__ import annotations

import logging

import torch
from torch import nn
import torch.nn.functional as F

from servelab.core.errors import ConfigError
from servelab.exec.model.layers import ColumnParallelLinear, RowParallelLinear
from servelab.kernels.kv_quant import KVCacheDTypeError, kv_storage_dtype, round_half_away

log = logging.getLogger(__name__)

QUANTIZATION_METHODS = ("none", "int8")
LINEAR_KERNELS = ("triton", "int8pack", "dequant")
ROUND_TRIP_BOUND = 1 / 254  # max |w - dequant(quant(w))| / amax(|row|)


def quantize_weight(weight: torch.Tensor, row_amax: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``weight[N, K]`` -> (int8 ``[N, K]``, float32 per-row scales ``[N]``). ``row_amax``: each row's
    largest magnitude when ``weight`` is a slice of the rows (a row-parallel shard); default its own."""
    w = weight.float()
    scales = (w.abs().amax(1) if row_amax is None else row_amax.float()) / 127.0
    scales = torch.where(scales > 0, scales, torch.ones_like(scales))
    return round_half_away(w / scales[:, None]).clamp_(-127, 127).to(torch.int8), scales


def dequantize_weight(qweight: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return (qweight.float() * scales.float()[:, None]).to(dtype)


class Int8Weight(nn.Module):
    """A linear layer's weight in INT8 with per-output-channel scales; ``forward(x, bias)`` = ``x W^T + b``."""

    def __init__(self, weight: torch.Tensor, kernel: str, row_amax: torch.Tensor | None = None) -> None:
        super().__init__()
        if kernel not in LINEAR_KERNELS:
            raise ValueError(f"int8 linear kernel {kernel!r} is not one of {list(LINEAR_KERNELS)}")
        qweight, scales = quantize_weight(weight, row_amax)
        self.register_buffer("qweight", qweight.contiguous())
        # int8pack wants the scales in the activation dtype; the others read fp32
        self.register_buffer("scales", scales.to(weight.dtype) if kernel == "int8pack" else scales)
        self.kernel = kernel

    def forward(self, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])
        if self.kernel == "int8pack":
            out = torch.ops.aten._weight_int8pack_mm(x2.contiguous(), self.qweight, self.scales)
        elif self.kernel == "triton":
            from servelab.kernels.triton_int8_matmul import int8_matmul  # noqa: PLC0415 - needs triton

            out = int8_matmul(x2, self.qweight, self.scales)
        else:
            out = F.linear(x2, dequantize_weight(self.qweight, self.scales, x.dtype))
        if bias is not None:
            out = out + bias
        return out.reshape(*shape[:-1], out.shape[-1])


def decoder_linears(model: nn.Module):
    """``(name, layer)`` for every decoder linear layer (what ``model.quantization`` quantises)."""
    for name, module in model.named_modules():
        if name.startswith("layers.") and isinstance(module, (ColumnParallelLinear, RowParallelLinear)):
            yield name, module


def quantize_model(model: nn.Module, method: str, kernel: str, collective_device: torch.device | None = None) -> int:
    """Quantise ``model``'s decoder linears in place with ``method``; returns how many layers changed.
    ``collective_device``: where the tensor-parallel group's collectives take their tensors (NCCL: the GPU)."""
    if method not in QUANTIZATION_METHODS:
        raise ConfigError(f"model.quantization={method!r} is not one of {list(QUANTIZATION_METHODS)}")
    if method == "none":
        return 0
    count = 0
    for _, layer in decoder_linears(model):
        row_amax = None
        if isinstance(layer, RowParallelLinear) and layer.tp.size > 1:
            # this rank holds a slice of every row: take the scale of the whole row, so every
            # tensor_parallel_size stores the same INT8 values. An expert's rows are shared by the
            # ranks of its expert-parallel group only (``shared_by`` consecutive ranks)
            local = layer.weight.data.float().abs().amax(1).unsqueeze(0)
            local = local.to(collective_device) if collective_device is not None else local
            gathered = layer.tp.all_gather_last_dim(local).view(layer.tp.size, -1)
            shared_by = getattr(layer, "shared_by", layer.tp.size)
            first = layer.tp.rank // shared_by * shared_by
            row_amax = gathered[first:first + shared_by].amax(0).to(layer.weight.device)
        layer.int8 = Int8Weight(layer.weight.data, kernel, row_amax)
        layer.weight = None  # the full-precision copy is freed
        count += 1
    log.info("model.quantization=int8: %d decoder linear layers in INT8 (%s matmul)", count, kernel)
    return count


def linear_kernel(attention_backend: str, device: torch.device, dtype: torch.dtype) -> str:
    """The INT8 matmul to use: Triton with the Triton attention backend, else torch's int8pack kernel
    if it runs for ``device``/``dtype``, else dequantise per call.

    float32 on CPU dequantises: torch 2.13's float32 ``_weight_int8pack_mm`` is a scalar fallback
    (measured on this project's CPU at 4096 x 192 x 1024: 3.2 s, against 0.06 s to dequantise and
    call sgemm, and 0.12 s for its bfloat16 path), so it would only make the INT8 runs slow."""
    if attention_backend == "triton":
        return "triton"
    if dtype == torch.float32 and device.type == "cpu":
        log.info("model.quantization=int8 with float32 on CPU: weights dequantised per call "
                 "(torch's float32 int8pack matmul is a slow fallback)")
        return "dequant"
    try:
        x = torch.ones(1, 16, dtype=dtype, device=device)
        torch.ops.aten._weight_int8pack_mm(x, torch.ones(16, 16, dtype=torch.int8, device=device),
                                           torch.ones(16, dtype=dtype, device=device))
        return "int8pack"
    except (RuntimeError, NotImplementedError, AttributeError):
        log.info("aten._weight_int8pack_mm does not run for %s on %s: INT8 weights are dequantised per call",
                 dtype, device.type)
        return "dequant"


def kv_cache_storage_dtype(name: str, compute_dtype: torch.dtype, device: torch.device,
                           attention_backend: str) -> torch.dtype:
    """The KV cache tensors' dtype for ``kv_cache_dtype=name``; a :class:`ConfigError` naming the key
    when this torch build or device cannot store or read it."""
    try:
        dtype = kv_storage_dtype(name, compute_dtype)
    except KVCacheDTypeError as exc:
        raise ConfigError(str(exc)) from None
    if name != "fp8_e4m3":
        return dtype
    if device.type == "cuda" and attention_backend == "triton":
        major, minor = torch.cuda.get_device_capability(device)
        if (major, minor) < (8, 9):
            raise ConfigError(f"kv_cache_dtype=fp8_e4m3: {torch.cuda.get_device_name(device)} (compute capability "
                              f"{major}.{minor}) has no FP8 conversions for the Triton kernels (needs 8.9+); "
                              "use kv_cache_dtype=int8 or attention_backend=torch")
    try:
        torch.ones(2, device=device).to(dtype).float()
    except (RuntimeError, TypeError) as exc:
        raise ConfigError(f"kv_cache_dtype=fp8_e4m3: torch cannot cast to float8_e4m3fn on {device} ({exc}); "
                          "use kv_cache_dtype=int8 or auto") from None
    return dtype
