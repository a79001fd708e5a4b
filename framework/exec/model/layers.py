"""Building blocks of the Llama-family decoder, tensor-parallel aware (Megatron-style).

With ``tp.size == 1`` every layer is the plain one and every collective is a no-op.
Column-parallel layers hold a slice of the output features; row-parallel layers hold a slice of
the input features and all-reduce their partial sums.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn
import torch.nn.functional as F


@dataclass
class TPGroup:
    """This process's place in the tensor-parallel group and its collectives; ``ep_size``: how many
    ways a mixture-of-experts layer splits its experts over the group (``expert_parallel_size``)."""

    rank: int = 0
    size: int = 1
    all_reduce: Callable[[torch.Tensor], torch.Tensor] = lambda t: t
    all_gather_last_dim: Callable[[torch.Tensor], torch.Tensor] = lambda t: t
    ep_size: int = 1


def _no_send(t: torch.Tensor) -> None:
    raise RuntimeError("a single pipeline stage has no neighbour")


def _no_recv(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    raise RuntimeError("a single pipeline stage has no neighbour")


@dataclass
class PipelineStage:
    """This process's pipeline stage, ``index`` of ``size`` (its layers: vLLM's split,
    :func:`servelab.core.parallel_layout.pipeline_stages`), and the point-to-point links: ``send`` hidden states
    to the next stage, ``recv`` them from the previous one, ``send_logits`` from the last stage to
    rank 0, ``recv_logits`` there."""

    index: int = 0
    size: int = 1
    send: Callable[[torch.Tensor], None] = _no_send
    recv: Callable[[tuple[int, ...], torch.dtype], torch.Tensor] = _no_recv
    send_logits: Callable[[torch.Tensor], None] = _no_send
    recv_logits: Callable[[tuple[int, ...], torch.dtype], torch.Tensor] = _no_recv

    @property
    def first(self) -> bool:
        return self.index == 0

    @property
    def last(self) -> bool:
        return self.index == self.size - 1


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        dtype = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dtype)


class Rotary(nn.Module):
    """RoPE (rotate-half form, as HF Llama) with a precomputed cos/sin table."""

    def __init__(self, inv_freq: torch.Tensor, scaling: float, max_positions: int) -> None:
        super().__init__()
        freqs = torch.arange(max_positions, dtype=torch.float).unsqueeze(1) * inv_freq.float().unsqueeze(0)
        emb = torch.cat((freqs, freqs), dim=-1)
        self.register_buffer("cos", emb.cos() * scaling, persistent=False)
        self.register_buffer("sin", emb.sin() * scaling, persistent=False)

    def forward(self, positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor):
        cos = self.cos[positions].unsqueeze(1).to(q.dtype)  # [T, 1, d]
        sin = self.sin[positions].unsqueeze(1).to(q.dtype)
        return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


class ColumnParallelLinear(nn.Module):
    """``y = x W^T (+ b)`` where this rank holds ``out_features`` rows of ``W`` (its shard).

    ``int8``: set by ``servelab.exec.quant.quantize_model`` (``model.quantization=int8``); then ``weight``
    is None and the INT8 copy computes the product."""

    def __init__(self, in_features: int, out_features: int, bias: bool = False) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features))
        self.bias = nn.Parameter(torch.empty(out_features)) if bias else None
        self.int8 = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.int8 is not None:
            return self.int8(x, self.bias)
        return F.linear(x, self.weight, self.bias)


class RowParallelLinear(nn.Module):
    """``y = all_reduce(x_shard W_shard^T)``: this rank holds ``in_features`` columns of ``W``
    (``int8``: as :class:`ColumnParallelLinear`)."""

    def __init__(self, in_features: int, out_features: int, tp: TPGroup) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features))
        self.tp = tp
        self.int8 = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.int8 is not None:
            return self.tp.all_reduce(self.int8(x))
        return self.tp.all_reduce(F.linear(x, self.weight))


class VocabParallelEmbedding(nn.Module):
    """Embedding whose rows (vocab) are split across ranks; out-of-shard ids contribute zeros."""

    def __init__(self, vocab_size: int, dim: int, tp: TPGroup) -> None:
        super().__init__()
        self.shard = -(-vocab_size // tp.size)
        self.start = tp.rank * self.shard
        self.weight = nn.Parameter(torch.empty(self.shard, dim))
        self.tp = tp

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.tp.size == 1:
            return F.embedding(ids, self.weight)
        local = ids - self.start
        inside = (local >= 0) & (local < self.shard)
        out = F.embedding(local.clamp(0, self.shard - 1), self.weight) * inside.unsqueeze(-1)
        return self.tp.all_reduce(out)


class ParallelLMHead(nn.Module):
    """Logits for this rank's vocab shard, gathered to the full vocab for sampling."""

    def __init__(self, embedding_or_none: VocabParallelEmbedding | None, vocab_size: int, dim: int,
                 tp: TPGroup) -> None:
        super().__init__()
        self.vocab_size = vocab_size
        self.tp = tp
        self.tied = embedding_or_none
        if embedding_or_none is None:
            self.weight = nn.Parameter(torch.empty(-(-vocab_size // tp.size), dim))

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        weight = self.tied.weight if self.tied is not None else self.weight
        logits = F.linear(hidden, weight)
        return self.tp.all_gather_last_dim(logits)[..., : self.vocab_size]
