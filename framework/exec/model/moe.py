"""A mixture-of-experts MLP (Mixtral, Qwen3-MoE) over the flattened batch, expert- and tensor-parallel.

The router is replicated; each of the ``tp.size`` ranks holds ``num_experts / tp.ep_size`` experts
(expert parallelism: expert ``e`` lives on the ranks of EP group ``e // (num_experts / ep_size)``), each
expert's gated MLP split ``tp.size / tp.ep_size`` ways by its intermediate features (tensor parallelism
within the expert). A rank runs its experts on the tokens routed to them and one all-reduce sums the
partial outputs, as the row-parallel layers do; ``ep_size = 1`` is every expert split over every rank.
"""

from __future__ import annotations

import torch
from torch import nn
import torch.nn.functional as F

from servelab.core.model_spec import ModelSpec
from servelab.exec.model.layers import ColumnParallelLinear, RowParallelLinear, TPGroup


def expert_layout(spec: ModelSpec, tp: TPGroup) -> tuple[int, int, int, int]:
    """(first local expert, local experts, intermediate shard, this rank's index within its expert's shards)."""
    inner = tp.size // tp.ep_size  # ranks sharing one expert
    local = spec.num_experts // tp.ep_size
    return (tp.rank // inner) * local, local, spec.moe_intermediate_size // inner, tp.rank % inner


class ExpertDownProj(RowParallelLinear):
    """An expert's down projection: this rank's slice of its input features, left unreduced (the MoE
    block reduces once); ``shared_by`` ranks hold slices of the same expert (INT8 scales span them)."""

    def __init__(self, shard: int, hidden: int, tp: TPGroup, shared_by: int) -> None:
        super().__init__(shard, hidden, tp)
        self.shared_by = shared_by

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.int8(x) if self.int8 is not None else F.linear(x, self.weight)


class Expert(nn.Module):
    """One expert's shard: gate and up fused, down unreduced (the MoE block reduces once)."""

    def __init__(self, hidden: int, shard: int, tp: TPGroup) -> None:
        super().__init__()
        self.shard = shard
        self.gate_up_proj = ColumnParallelLinear(hidden, 2 * shard)
        self.down_proj = ExpertDownProj(shard, hidden, tp, tp.size // tp.ep_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up_proj(x).split(self.shard, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class Router(nn.Module):
    def __init__(self, hidden: int, num_experts: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_experts, hidden))


class SparseMoE(nn.Module):
    """Top-k routing as transformers' Mixtral / Qwen3-MoE: softmax over every expert in float32, the
    k largest, renormalised to sum 1 when ``spec.norm_topk_prob``."""

    def __init__(self, spec: ModelSpec, tp: TPGroup) -> None:
        super().__init__()
        self.first, local, shard, _ = expert_layout(spec, tp)
        self.top_k = spec.experts_per_token
        self.norm_topk_prob = spec.norm_topk_prob
        self.gate = Router(spec.hidden_size, spec.num_experts)
        self.experts = nn.ModuleList(Expert(spec.hidden_size, shard, tp) for _ in range(local))
        self.tp = tp

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        probs = torch.softmax(F.linear(x, self.gate.weight).float(), dim=-1)
        weights, chosen = torch.topk(probs, self.top_k, dim=-1)
        if self.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        weights = weights.to(x.dtype)
        out = torch.zeros_like(x)
        local = chosen - self.first  # this rank's experts are 0 .. len(experts) - 1
        for j in torch.unique(local[(local >= 0) & (local < len(self.experts))]).tolist():
            rows, slot = torch.where(local == j)
            out.index_add_(0, rows, self.experts[j](x[rows]) * weights[rows, slot, None])
        return self.tp.all_reduce(out)
