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
    """Sizes of a Llama-family decoder (what ``config.json`` fixes)."""

    num_layers: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 4096

    @classmethod
    def from_spec(cls, spec: ModelSpec) -> "ModelShape":
        """From a :class:`servelab.core.model_spec.ModelSpec`."""
        return cls(spec.num_layers, spec.hidden_size, spec.intermediate_size, spec.num_heads, spec.num_kv_heads,
                   spec.head_dim, spec.vocab_size, spec.tie_word_embeddings, spec.max_position_embeddings)

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
                       max_position_embeddings=cfg.get("max_position_embeddings", 4096))
        except KeyError as exc:
            raise ConfigError(f"{file}: config.json has no {exc.args[0]!r} (not a decoder-only transformer?)") from None

    # ---- parameters ---------------------------------------------------------------------
    @property
    def q_dim(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.num_kv_heads * self.head_dim

    @property
    def layer_linear_params(self) -> int:
        """q, k, v, o projections and the gated MLP (gate, up, down) of one layer."""
        h = self.hidden_size
        return h * (self.q_dim + 2 * self.kv_dim) + self.q_dim * h + 3 * h * self.intermediate_size

    @property
    def layer_linear_rows(self) -> int:
        """Output channels of one layer's linears (one INT8 scale each)."""
        return self.q_dim + 2 * self.kv_dim + self.hidden_size + 2 * self.intermediate_size + self.hidden_size

    @property
    def num_params(self) -> int:
        emb = self.vocab_size * self.hidden_size
        norms = (2 * self.num_layers + 1) * self.hidden_size
        return self.num_layers * self.layer_linear_params + emb * (1 if self.tie_word_embeddings else 2) + norms

    def weight_bytes(self, dtype_bytes: float, linear_dtype_bytes: float | None = None) -> float:
        """All weights, stored (embedding and LM head included). ``linear_dtype_bytes``: the decoder
        linears in another format (``model.quantization=int8``: 1, plus a float32 scale per output
        channel); embeddings, LM head and norms stay at ``dtype_bytes``."""
        if linear_dtype_bytes is None:
            return self.num_params * dtype_bytes
        linear = self.num_layers * self.layer_linear_params
        scales = self.num_layers * self.layer_linear_rows * INT8_SCALE_BYTES
        return (self.num_params - linear) * dtype_bytes + linear * linear_dtype_bytes + scales

    def weight_bytes_per_rank(self, dtype_bytes: float, tp: int, linear_dtype_bytes: float | None = None) -> float:
        """Megatron sharding: every linear layer, the embedding and the LM head split over ``tp``."""
        return self.weight_bytes(dtype_bytes, linear_dtype_bytes) / tp

    # ---- KV cache -----------------------------------------------------------------------
    def kv_heads_per_rank(self, tp: int) -> int:
        """KV heads split across ranks, replicated when there are more ranks than heads."""
        return max(1, self.num_kv_heads // tp)

    def kv_bytes_per_token(self, dtype_bytes: float, tp: int = 1, scale_bytes: float = 0.0) -> float:
        """K and V of one token on one rank, all layers; ``scale_bytes`` per (token, KV head) for a
        quantised cache (``kv_cache_dtype=int8|fp8_e4m3``: one float32 scale each)."""
        return 2 * self.num_layers * self.kv_heads_per_rank(tp) * (self.head_dim * dtype_bytes + scale_bytes)

    def check_tp(self, tp: int) -> None:
        if self.num_heads % tp:
            raise ConfigError(f"tensor_parallel_size={tp} does not divide the model's {self.num_heads} attention heads")
        if tp <= self.num_kv_heads and self.num_kv_heads % tp:
            raise ConfigError(f"tensor_parallel_size={tp} does not divide the model's {self.num_kv_heads} KV heads")
