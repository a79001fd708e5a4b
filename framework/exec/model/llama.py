"""The Llama-family decoder (Llama 1/2/3, Mistral, Qwen2, Qwen3; Mixtral and Qwen3-MoE with
:class:`~servelab.exec.model.moe.SparseMoE` MLPs) over a paged KV cache.

All tokens of a step arrive flattened into one varlen batch (no padding); attention reads and
writes the paged cache through the selected :class:`~servelab.kernels.AttentionOps`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn
import torch.nn.functional as F

from servelab.kernels import AttentionOps
from servelab.exec.model.layers import (ColumnParallelLinear, ParallelLMHead, PipelineStage, RMSNorm, Rotary,
                                        RowParallelLinear, TPGroup, VocabParallelEmbedding)
from servelab.core.model_spec import ModelSpec
from servelab.core.parallel_layout import pipeline_stages
from servelab.exec.model.moe import SparseMoE


@dataclass
class AttentionMetadata:
    """Where each token of the flattened batch lives in the paged cache (see kernels.reference)."""

    slot_mapping: torch.Tensor  # [T] int64, -1 = do not store
    block_tables: torch.Tensor  # [B, max_blocks] int32/64
    cu_seqlens_q: torch.Tensor  # [B + 1]
    context_lens: torch.Tensor  # [B]: tokens in the cache after this step's store
    max_query_len: int
    max_context_len: int


def local_heads(spec: ModelSpec, tp: TPGroup) -> tuple[int, int]:
    """(query heads, KV heads) held by this rank; KV heads are replicated when tp > num_kv_heads."""
    return spec.num_heads // tp.size, max(1, spec.num_kv_heads // tp.size)


class Attention(nn.Module):
    def __init__(self, spec: ModelSpec, tp: TPGroup, rotary: Rotary) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads = local_heads(spec, tp)
        self.head_dim = spec.head_dim
        self.q_size = self.num_heads * spec.head_dim
        self.kv_size = self.num_kv_heads * spec.head_dim
        self.qkv_proj = ColumnParallelLinear(spec.hidden_size, self.q_size + 2 * self.kv_size, bias=spec.qkv_bias)
        self.o_proj = RowParallelLinear(self.q_size, spec.hidden_size, tp)
        self.q_norm = RMSNorm(spec.head_dim, spec.rms_norm_eps) if spec.qk_norm else None
        self.k_norm = RMSNorm(spec.head_dim, spec.rms_norm_eps) if spec.qk_norm else None
        self.rotary = rotary
        self.scale = spec.head_dim ** -0.5

    def forward(self, positions, x, kv_cache, meta: AttentionMetadata, ops: AttentionOps):
        num_tokens = x.shape[0]
        q, k, v = self.qkv_proj(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(num_tokens, self.num_heads, self.head_dim)
        k = k.view(num_tokens, self.num_kv_heads, self.head_dim)
        v = v.view(num_tokens, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None:  # both or neither (spec.qk_norm)
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = self.rotary(positions, q, k)
        k_cache, v_cache, *scales = kv_cache  # scales: (k_scale, v_scale) of a quantised cache
        quant = dict(zip(("k_scale", "v_scale"), scales))
        ops.store_kv(k, v, k_cache, v_cache, meta.slot_mapping, **quant)
        out = ops.paged_attention(q, k_cache, v_cache, meta.block_tables, meta.cu_seqlens_q, meta.context_lens,
                                  meta.max_query_len, meta.max_context_len, self.scale, **quant)
        return self.o_proj(out.reshape(num_tokens, self.q_size))


class MLP(nn.Module):
    def __init__(self, spec: ModelSpec, tp: TPGroup) -> None:
        super().__init__()
        self.shard = spec.intermediate_size // tp.size
        self.gate_up_proj = ColumnParallelLinear(spec.hidden_size, 2 * self.shard)
        self.down_proj = RowParallelLinear(self.shard, spec.hidden_size, tp)

    def forward(self, x):
        gate, up = self.gate_up_proj(x).split(self.shard, dim=-1)
        return self.down_proj(F.silu(gate) * up)


class DecoderLayer(nn.Module):
    def __init__(self, spec: ModelSpec, tp: TPGroup, rotary: Rotary, index: int) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        self.self_attn = Attention(spec, tp, rotary)
        self.post_attention_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps)
        self.mlp = SparseMoE(spec, tp) if spec.is_moe_layer(index) else MLP(spec, tp)

    def forward(self, positions, x, kv_cache, meta, ops):
        x = x + self.self_attn(positions, self.input_layernorm(x), kv_cache, meta, ops)
        return x + self.mlp(self.post_attention_layernorm(x))


class CausalLM(nn.Module):
    """Parameter names follow HF (``model.layers.N.self_attn...``) with q/k/v and gate/up fused.

    A pipeline ``stage`` holds only its layers (the others are empty placeholders, so names keep their
    index), the embedding on the first stage, the final norm and LM head on the last (a tied LM head
    is a copy of the embedding there)."""

    def __init__(self, spec: ModelSpec, tp: TPGroup, max_positions: int, stage: PipelineStage | None = None) -> None:
        super().__init__()
        self.spec = spec
        self.tp = tp
        self.stage = stage = stage or PipelineStage()
        self.local_layers = pipeline_stages(spec.num_layers, stage.size)[stage.index]
        inv_freq, scaling = rope_frequencies(spec)
        rotary = Rotary(inv_freq, scaling, max_positions)
        self.embed_tokens = VocabParallelEmbedding(spec.vocab_size, spec.hidden_size, tp) if stage.first else None
        self.layers = nn.ModuleList(DecoderLayer(spec, tp, rotary, i) if i in self.local_layers else nn.Identity()
                                    for i in range(spec.num_layers))
        self.norm = RMSNorm(spec.hidden_size, spec.rms_norm_eps) if stage.last else None
        tied = self.embed_tokens if spec.tie_word_embeddings else None
        self.lm_head = ParallelLMHead(tied, spec.vocab_size, spec.hidden_size, tp) if stage.last else None
        self.rotary = rotary

    @torch.inference_mode()
    def forward(self, input_ids, positions, kv_caches, meta: AttentionMetadata, ops: AttentionOps):
        """Run this stage's layers over the flattened batch (``kv_caches``: theirs, in order); returns the
        final hidden states ``[T, hidden]`` on the last stage, None on the others (they send theirs on)."""
        stage = self.stage
        if stage.first:
            x = self.embed_tokens(input_ids)
        else:
            x = stage.recv((input_ids.shape[0], self.spec.hidden_size), next(self.parameters()).dtype)
        for i, kv_cache in zip(self.local_layers, kv_caches):
            x = self.layers[i](positions, x, kv_cache, meta, ops)
        if not stage.last:
            stage.send(x)
            return None
        return self.norm(x)

    @torch.inference_mode()
    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """Full-vocabulary logits (gathered across ranks) in float32."""
        return self.lm_head(hidden).float()


def rope_frequencies(spec: ModelSpec) -> tuple[torch.Tensor, float]:
    """Inverse frequencies and attention scaling, computed by transformers' own RoPE functions."""
    if spec.rope_type == "default":
        dim = spec.head_dim
        return 1.0 / (spec.rope_theta ** (torch.arange(0, dim, 2, dtype=torch.float) / dim)), 1.0
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # noqa: PLC0415 - transformers

    return ROPE_INIT_FUNCTIONS[spec.rope_type](spec.hf_config, torch.device("cpu"))
