"""Model shapes and hardware profiles: the arithmetic of weights, KV bytes and per-rank memory.

A :class:`ModelShape` is what a ``config.json`` says about sizes (no weights); a
:class:`HardwareProfile` is a spec sheet. Both feed the simulator's memory accounting and the
time models; nothing here touches tensors.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from servelab.core.errors import ConfigError
from servelab.core.parallel_layout import (check_expert_parallel, check_pipeline_parallel, moe_fields_of,
                                           pipeline_stages)

if TYPE_CHECKING:
    from servelab.core.model_spec import ModelSpec

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "int8": 1, "fp8_e4m3": 1}
INT8_SCALE_BYTES = 4  # one float32 scale per output channel (weights) or per token and KV head (KV)


@dataclass(frozen=True)
class StorageBytes:
    """Bytes per stored value under a quantisation setting: what the simulator's memory accounting
    and the time models price (``model.dtype``, ``model.quantization``, ``kv_cache_dtype``)."""

    weight: float  # embeddings, LM head, norms (model.dtype)
    linear: float | None  # decoder linears; None = model.dtype
    kv: float
    kv_scale: float  # per (token, KV head)

    @classmethod
    def of(cls, dtype: str, quantization: str = "none", kv_cache_dtype: str = "auto") -> "StorageBytes":
        if quantization not in ("none", "int8"):
            raise ConfigError(f"model.quantization={quantization!r} is not one of ['none', 'int8']")
        if kv_cache_dtype not in ("auto", "int8", "fp8_e4m3"):
            raise ConfigError(f"kv_cache_dtype={kv_cache_dtype!r} is not one of ['auto', 'int8', 'fp8_e4m3']")
        quant_kv = kv_cache_dtype != "auto"
        return cls(weight=DTYPE_BYTES[dtype], linear=1.0 if quantization == "int8" else None,
                   kv=DTYPE_BYTES[kv_cache_dtype] if quant_kv else DTYPE_BYTES[dtype],
                   kv_scale=INT8_SCALE_BYTES if quant_kv else 0.0)


@dataclass(frozen=True)
class HardwareProfile:
    """One accelerator's spec sheet (decimal units: 1 GB = 1e9 bytes, as the sheets print them).

    ``link_bandwidth_gb_s`` is the per-direction GPU-to-GPU bandwidth a ring all-reduce sees
    (NVLink, or PCIe on cards without it); ``host_link_gb_s`` is the per-direction host link
    (PCIe) that swap copies cross.
    """

    name: str
    memory_gb: float
    hbm_bandwidth_gb_s: float
    peak_tflops: float  # dense bf16/fp16 tensor-core FLOP/s, in 1e12
    link_bandwidth_gb_s: float
    host_link_gb_s: float
    link_latency_us: float = 10.0
    # KV transfers between replicas (prefill/decode disaggregation): per GPU, per direction
    intra_node_link_gb_s: float = 0.0  # 0 = link_bandwidth_gb_s (read it through kv_link)
    intra_node_latency_us: float = 10.0
    inter_node_link_gb_s: float = 25.0
    inter_node_latency_us: float = 20.0
    # Hardware without measured tables: whose measured op tables price it (its HBM rescaling the
    # decoder layers), and the rule in words (None: its own tables, or the calibrated roofline)
    tables_from: str | None = None
    pricing_rule: str | None = None

    @classmethod
    def from_config(cls, node: Mapping[str, Any]) -> "HardwareProfile":
        """From the ``hardware`` config node; a non-positive figure is an error naming its key."""
        values = {f: node.get(f, cls.__dataclass_fields__[f].default) for f in cls.__dataclass_fields__}
        if not values["intra_node_link_gb_s"]:  # null: the GPU-to-GPU link the all-reduce uses
            values["intra_node_link_gb_s"] = values["link_bandwidth_gb_s"]
        for key, value in values.items():
            if key in ("name", "tables_from", "pricing_rule"):
                continue
            if not (value > 0 or (key.endswith("latency_us") and value == 0)):
                raise ConfigError(f"hardware.{key}={value} must be > 0 (hardware={values['name']})")
        return cls(**values)

    @property
    def memory_bytes(self) -> float:
        return self.memory_gb * 1e9

    def kv_link(self, same_node: bool) -> tuple[float, float]:
        """(bytes/s, latency s) of one GPU's link to a GPU of another replica: NVLink (or PCIe) on
        the same node, the node's network (InfiniBand / RoCE) between nodes."""
        if same_node:
            return (self.intra_node_link_gb_s or self.link_bandwidth_gb_s) * 1e9, self.intra_node_latency_us * 1e-6
        return self.inter_node_link_gb_s * 1e9, self.inter_node_latency_us * 1e-6


@dataclass(frozen=True)
class ModelShape:
    """Sizes of a decoder (what ``config.json`` fixes): Llama-family attention and MLP, optionally
    mixture-of-experts MLPs and multi-head latent attention (MLA).

    MoE (``num_experts`` > 0): a MoE layer holds ``num_experts`` routed experts of
    ``moe_intermediate_size`` (each a gated MLP), ``experts_per_token`` of them run per token, plus
    ``num_shared_experts`` that every token runs (``shared_expert_intermediate_size`` each, 0 = the
    routed size). Layer ``i`` is MoE iff ``i >= first_dense_layers`` and ``(i + 1) % moe_layer_step == 0``
    (DeepSeek's ``first_k_dense_replace``; Qwen's ``decoder_sparse_step``, DeepSeek's ``moe_layer_freq``,
    1 in every released DeepSeek config, where its rule ``i % freq == 0`` agrees); the others are dense
    (``intermediate_size``). MLA (``kv_lora_rank`` > 0): the cache holds one latent of
    ``kv_lora_rank + qk_rope_head_dim`` values per token and layer, the same on every TP rank.
    """

    num_layers: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 4096
    num_experts: int = 0
    experts_per_token: int = 0
    moe_intermediate_size: int = 0
    num_shared_experts: int = 0
    shared_expert_intermediate_size: int = 0
    first_dense_layers: int = 0
    moe_layer_step: int = 1
    kv_lora_rank: int = 0
    q_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    qk_nope_head_dim: int = 0
    v_head_dim: int = 0

    @classmethod
    def from_spec(cls, spec: ModelSpec) -> "ModelShape":
        """From a :class:`servelab.core.model_spec.ModelSpec`."""
        return cls(spec.num_layers, spec.hidden_size, spec.intermediate_size, spec.num_heads, spec.num_kv_heads,
                   spec.head_dim, spec.vocab_size, spec.tie_word_embeddings, spec.max_position_embeddings,
                   **spec.moe_fields())

    @classmethod
    def from_config_json(cls, path: str | Path) -> "ModelShape":
        """From an HF ``config.json`` (a file, or a directory holding one)."""
        path = Path(path)
        file = path / "config.json" if path.is_dir() else path
        try:
            cfg = json.loads(file.read_text())
        except (OSError, ValueError) as exc:
            raise ConfigError(f"model.path={str(path)!r}: cannot read a config.json there ({exc})") from None
        cfg = cfg.get("text_config", cfg)
        try:
            heads = cfg["num_attention_heads"]
            return cls(num_layers=cfg["num_hidden_layers"], hidden_size=cfg["hidden_size"],
                       intermediate_size=cfg["intermediate_size"], num_heads=heads,
                       num_kv_heads=cfg.get("num_key_value_heads") or heads,
                       head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads, vocab_size=cfg["vocab_size"],
                       tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
                       max_position_embeddings=cfg.get("max_position_embeddings", 4096), **moe_fields_of(cfg))
        except KeyError as exc:
            raise ConfigError(f"{file}: config.json has no {exc.args[0]!r} (not a decoder-only transformer?)") from None

    # ---- mixture of experts and latent attention ------------------------------------------
    @property
    def is_moe(self) -> bool:
        return self.num_experts > 0

    @property
    def is_mla(self) -> bool:
        return self.kv_lora_rank > 0

    def is_moe_layer(self, layer: int) -> bool:
        return self.is_moe and layer >= self.first_dense_layers and (layer + 1) % self.moe_layer_step == 0

    @property
    def num_moe_layers(self) -> int:
        return sum(self.is_moe_layer(i) for i in range(self.num_layers))

    @property
    def shared_intermediate_size(self) -> int:
        """All shared experts' intermediate width together (they run on every token)."""
        return self.num_shared_experts * (self.shared_expert_intermediate_size or self.moe_intermediate_size)

    # ---- parameters ---------------------------------------------------------------------
    @property
    def q_dim(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def attention_params(self) -> int:
        """One layer's attention projections: q, k, v, o; or MLA's q (through its LoRA), the joint
        KV down-projection with the RoPE key, the KV up-projection and o."""
        h = self.hidden_size
        if not self.is_mla:
            return h * (self.q_dim + 2 * self.kv_dim) + self.q_dim * h
        qk = self.num_heads * (self.qk_nope_head_dim + self.qk_rope_head_dim)
        q = self.q_lora_rank * (h + qk) if self.q_lora_rank else h * qk
        kv = h * (self.kv_lora_rank + self.qk_rope_head_dim) + \
            self.kv_lora_rank * self.num_heads * (self.qk_nope_head_dim + self.v_head_dim)
        return q + kv + self.num_heads * self.v_head_dim * h

    def _attention_rows(self) -> int:
        if not self.is_mla:
            return self.q_dim + 2 * self.kv_dim + self.hidden_size
        qk = self.num_heads * (self.qk_nope_head_dim + self.qk_rope_head_dim)
        return (self.q_lora_rank + qk if self.q_lora_rank else qk) + self.kv_lora_rank + self.qk_rope_head_dim + \
            self.num_heads * (self.qk_nope_head_dim + self.v_head_dim) + self.hidden_size

    def mlp_params(self, layer: int) -> int:
        """Layer ``layer``'s MLP: gate, up, down; a MoE layer's every routed expert, its shared
        experts and its router."""
        h = self.hidden_size
        if not self.is_moe_layer(layer):
            return 3 * h * self.intermediate_size
        return self.num_experts * (3 * h * self.moe_intermediate_size + h) + 3 * h * self.shared_intermediate_size

    def _mlp_rows(self, layer: int) -> int:
        if not self.is_moe_layer(layer):
            return 2 * self.intermediate_size + self.hidden_size
        shared = 2 * self.shared_intermediate_size + self.hidden_size if self.num_shared_experts else 0
        return self.num_experts * (2 * self.moe_intermediate_size + self.hidden_size + 1) + shared

    @property
    def active_params(self) -> int:
        """Parameters one token runs through: every attention and dense MLP, ``experts_per_token``
        routed experts and the shared ones in a MoE layer, the router; embedding and LM head."""
        h = self.hidden_size
        moe = self.num_moe_layers
        per_moe = self.experts_per_token * 3 * h * self.moe_intermediate_size + 3 * h * self.shared_intermediate_size \
            + self.num_experts * h
        mlp = (self.num_layers - moe) * 3 * h * self.intermediate_size + moe * per_moe
        return self.num_params - self.decoder_linear_params + self.num_layers * self.attention_params + mlp

    def decoder_linear_params_of(self, layers: range) -> int:
        return sum(self.attention_params + self.mlp_params(i) for i in layers)

    @property
    def decoder_linear_params(self) -> int:
        """Every decoder layer's linears (a MoE layer's every expert)."""
        return self.decoder_linear_params_of(range(self.num_layers))

    @property
    def layer_linear_params(self) -> float:
        """q, k, v, o projections and the gated MLP (gate, up, down) of one layer (a MoE model: the
        mean over layers of every expert stored, what ``num_layers x`` this sums to)."""
        h = self.hidden_size
        if not self.is_moe:
            return self.attention_params + 3 * h * self.intermediate_size
        return self.decoder_linear_params / self.num_layers

    def _linear_rows_of(self, layers: range) -> int:
        return sum(self._attention_rows() + self._mlp_rows(i) for i in layers)

    @property
    def layer_linear_rows(self) -> float:
        """Output channels of one layer's linears (one INT8 scale each; a MoE model: the mean)."""
        return self._linear_rows_of(range(self.num_layers)) / self.num_layers if self.is_moe else \
            self._attention_rows() + 2 * self.intermediate_size + self.hidden_size

    def _norm_params_of(self, layers: range) -> int:
        """RMSNorm weights of ``layers`` (two per layer; MLA's latent norms too)."""
        return len(layers) * (2 * self.hidden_size + (self.q_lora_rank + self.kv_lora_rank if self.is_mla else 0))

    @property
    def num_params(self) -> int:
        emb = self.vocab_size * self.hidden_size
        layers = range(self.num_layers)
        return self.decoder_linear_params + self._norm_params_of(layers) + self.hidden_size + \
            emb * (1 if self.tie_word_embeddings else 2)

    def weight_bytes(self, dtype_bytes: float, linear_dtype_bytes: float | None = None) -> float:
        """All weights, stored (embedding and LM head included). ``linear_dtype_bytes``: the decoder
        linears in another format (``model.quantization=int8``: 1, plus a float32 scale per output
        channel); embeddings, LM head and norms stay at ``dtype_bytes``."""
        return self._stage_weight_bytes(range(self.num_layers), True, True, dtype_bytes, linear_dtype_bytes)

    def _stage_weight_bytes(self, layers: range, first: bool, last: bool, dtype_bytes: float,
                            linear_dtype_bytes: float | None) -> float:
        """The weights of a pipeline stage holding ``layers`` (the embedding on the first, the final norm
        and LM head on the last; a tied LM head is a copy of its own on a last stage that is not the first)."""
        linear = self.decoder_linear_params_of(layers)
        emb = self.vocab_size * self.hidden_size
        other = self._norm_params_of(layers) + (emb if first else 0) + \
            ((self.hidden_size + (emb if not (self.tie_word_embeddings and first) else 0)) if last else 0)
        if linear_dtype_bytes is None:
            return (linear + other) * dtype_bytes
        scales = self._linear_rows_of(layers) * INT8_SCALE_BYTES
        return other * dtype_bytes + linear * linear_dtype_bytes + scales

    def weight_bytes_per_rank(self, dtype_bytes: float, tp: int, linear_dtype_bytes: float | None = None,
                              pp: int = 1, stage: int | None = None) -> float:
        """Megatron sharding: every linear layer, the embedding and the LM head split over ``tp`` (a MoE
        layer's experts too: ``ep`` ways by expert and ``tp / ep`` within each, so 1/tp of them per rank
        whatever ``ep`` is); with ``pp`` stages, pipeline stage ``stage``'s share (None: the largest;
        :meth:`stage_layers`)."""
        stages = list(enumerate(self.stage_layers(pp)))
        if stage is not None:
            stages = [stages[stage]]
        return max(self._stage_weight_bytes(layers, i == 0, i == pp - 1, dtype_bytes, linear_dtype_bytes)
                   for i, layers in stages) / tp

    def routed_expert_bytes(self, dtype_bytes: float, linear_dtype_bytes: float | None = None) -> float:
        """Every MoE layer's routed experts (gate, up, down; their INT8 scales), stored: what expert
        parallelism splits over the ranks."""
        h, moe = self.hidden_size, self.num_moe_layers
        params = moe * self.num_experts * 3 * h * self.moe_intermediate_size
        if linear_dtype_bytes is None:
            return params * dtype_bytes
        return params * linear_dtype_bytes + moe * self.num_experts * (2 * self.moe_intermediate_size + h) * INT8_SCALE_BYTES

    def dp_attention_weight_bytes_per_rank(self, dtype_bytes: float, ranks: int,
                                           linear_dtype_bytes: float | None = None) -> float:
        """Data-parallel attention beside expert parallelism over ``ranks``: every weight replicated on each
        rank (attention, dense layers, router, shared experts, embedding, LM head: SGLang's
        ``--enable-dp-attention`` with ``--moe-dense-tp-size 1``) but the routed experts, ``1 / ranks`` of
        them per rank (``ep`` ways by expert and ``ranks / ep`` within each)."""
        routed = self.routed_expert_bytes(dtype_bytes, linear_dtype_bytes)
        return self.weight_bytes(dtype_bytes, linear_dtype_bytes) - routed + routed / ranks

    def stage_layers(self, pp: int) -> list[range]:
        """The layers of each of ``pp`` pipeline stages, as vLLM splits them (``get_pp_indices``): an
        even share each, the remainder one more each on the stages before the last (which holds the LM head)."""
        return pipeline_stages(self.num_layers, pp)

    # ---- KV cache -----------------------------------------------------------------------
    def kv_heads_per_rank(self, tp: int) -> int:
        """KV heads split across ranks, replicated when there are more ranks than heads (MLA: its one latent)."""
        return 1 if self.is_mla else max(1, self.num_kv_heads // tp)

    def kv_bytes_per_token(self, dtype_bytes: float, tp: int = 1, scale_bytes: float = 0.0,
                           num_layers: int | None = None) -> float:
        """K and V of one token on one rank, all layers (or ``num_layers``: a pipeline stage's);
        ``scale_bytes`` per (token, KV head) for a quantised cache (``kv_cache_dtype=int8|fp8_e4m3``:
        one float32 scale each). MLA: the latent (``kv_lora_rank + qk_rope_head_dim`` values) and one
        scale per token and layer, on every TP rank (vLLM's MLA replicates it)."""
        layers = self.num_layers if num_layers is None else num_layers
        if self.is_mla:
            return layers * ((self.kv_lora_rank + self.qk_rope_head_dim) * dtype_bytes + scale_bytes)
        return 2 * layers * self.kv_heads_per_rank(tp) * (self.head_dim * dtype_bytes + scale_bytes)

    def check_tp(self, tp: int) -> None:
        self.check_parallel(tp)

    def check_parallel(self, tp: int, ep: int = 1, pp: int = 1) -> None:
        """One :class:`ConfigError` line naming the key when the model cannot be laid out this way."""
        if self.num_heads % tp:
            raise ConfigError(f"tensor_parallel_size={tp} does not divide the model's {self.num_heads} attention heads")
        if not self.is_mla and tp <= self.num_kv_heads and self.num_kv_heads % tp:
            raise ConfigError(f"tensor_parallel_size={tp} does not divide the model's {self.num_kv_heads} KV heads")
        check_expert_parallel(ep, tp, self.num_experts, self.moe_intermediate_size)
        check_pipeline_parallel(pp, self.num_layers)
