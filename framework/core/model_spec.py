"""What the model code needs to know about a checkpoint, read from its HF ``config.json``."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from servelab.core.errors import ServelabError

SUPPORTED_ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "MixtralForCausalLM": "mixtral",
    "Qwen3MoeForCausalLM": "qwen3_moe",
}
STATIC_ROPE_TYPES = ("default", "linear", "llama3", "yarn")


class CheckpointError(ServelabError):
    """A checkpoint directory that cannot be loaded; the message names what is wrong."""


@dataclass(frozen=True)
class ModelSpec:
    architecture: str
    family: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    qkv_bias: bool
    qk_norm: bool
    rope_type: str
    rope_theta: float
    eos_token_ids: tuple[int, ...]
    hf_config: Any = field(repr=False, compare=False, default=None)
    # Mixture of experts (Mixtral, Qwen3-MoE; 0 experts = dense): routed experts, top-k, their width,
    # whether the top-k weights are renormalised, and which layers are MoE (every moe_layer_step-th,
    # except mlp_only_layers)
    num_experts: int = 0
    experts_per_token: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = True
    moe_layer_step: int = 1
    mlp_only_layers: tuple[int, ...] = ()

    def is_moe_layer(self, layer: int) -> bool:
        return self.num_experts > 0 and layer not in self.mlp_only_layers and (layer + 1) % self.moe_layer_step == 0

    def moe_fields(self) -> dict[str, int]:
        """The MoE fields of :class:`servelab.core.shapes.ModelShape` (empty for a dense model)."""
        if not self.num_experts:
            return {}
        return {"num_experts": self.num_experts, "experts_per_token": self.experts_per_token,
                "moe_intermediate_size": self.moe_intermediate_size, "moe_layer_step": self.moe_layer_step}


def load_spec(path: str | Path) -> ModelSpec:
    """Parse ``path/config.json`` with transformers; reject what the model code cannot run."""
    path = Path(path)
    if not (path / "config.json").is_file():
        raise CheckpointError(f"model.path={str(path)!r}: no config.json there (expected an HF-format "
                              "checkpoint directory: config.json + *.safetensors)")
    try:
        json.loads((path / "config.json").read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:  # transformers says OSError, naming no line
        raise CheckpointError(f"model.path={str(path)!r}: {path / 'config.json'} is not valid JSON ({exc})") from None
    from transformers import AutoConfig  # noqa: PLC0415 - transformers (and torch): core stays light

    try:
        cfg = AutoConfig.from_pretrained(str(path), local_files_only=True)
    except (OSError, ValueError, KeyError) as exc:
        raise CheckpointError(f"{path}/config.json could not be parsed by transformers: {exc}") from exc
    archs = list(getattr(cfg, "architectures", None) or [])
    arch = next((a for a in archs if a in SUPPORTED_ARCHITECTURES), None)
    if arch is None:
        raise CheckpointError(f"{path}: architecture {archs or cfg.model_type!r} is not supported; "
                              f"supported: {', '.join(SUPPORTED_ARCHITECTURES)}")
    family = SUPPORTED_ARCHITECTURES[arch]
    if family in ("mistral", "mixtral") and getattr(cfg, "sliding_window", None):
        if cfg.sliding_window < cfg.max_position_embeddings:
            raise CheckpointError(f"{path}: {family.capitalize()} sliding_window={cfg.sliding_window} is not supported "
                                  "(set it to null in config.json to run with full attention)")
    if family in ("qwen2", "qwen3", "qwen3_moe") and getattr(cfg, "use_sliding_window", False):
        raise CheckpointError(f"{path}: use_sliding_window=true is not supported")
    rope = _rope_parameters(cfg)
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    if rope_type not in STATIC_ROPE_TYPES:
        raise CheckpointError(f"{path}: rope type {rope_type!r} is not supported; supported: {STATIC_ROPE_TYPES}")
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    eos = cfg.eos_token_id
    eos = tuple(eos) if isinstance(eos, (list, tuple)) else (() if eos is None else (eos,))
    return ModelSpec(
        architecture=arch,
        family=family,
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_layers=cfg.num_hidden_layers,
        num_heads=cfg.num_attention_heads,
        num_kv_heads=getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads,
        head_dim=head_dim,
        rms_norm_eps=cfg.rms_norm_eps,
        max_position_embeddings=cfg.max_position_embeddings,
        tie_word_embeddings=bool(getattr(cfg, "tie_word_embeddings", False)),
        qkv_bias=family == "qwen2" or bool(getattr(cfg, "attention_bias", False)),
        qk_norm=family in ("qwen3", "qwen3_moe"),
        rope_type=rope_type,
        rope_theta=float(rope.get("rope_theta", 10000.0)),
        eos_token_ids=eos,
        hf_config=cfg,
        **_moe(cfg, family),
    )


def _moe(cfg: Any, family: str) -> dict[str, Any]:
    """The MoE fields of a Mixtral / Qwen3-MoE config (Mixtral's experts are ``intermediate_size`` wide
    and always renormalise their top-k weights)."""
    if family == "mixtral":
        return {"num_experts": cfg.num_local_experts, "experts_per_token": cfg.num_experts_per_tok,
                "moe_intermediate_size": cfg.intermediate_size, "norm_topk_prob": True}
    if family == "qwen3_moe":
        return {"num_experts": cfg.num_experts, "experts_per_token": cfg.num_experts_per_tok,
                "moe_intermediate_size": cfg.moe_intermediate_size, "norm_topk_prob": bool(cfg.norm_topk_prob),
                "moe_layer_step": cfg.decoder_sparse_step or 1, "mlp_only_layers": tuple(cfg.mlp_only_layers or ())}
    return {}


def _rope_parameters(cfg: Any) -> dict[str, Any]:
    """transformers 5 keeps RoPE settings in ``rope_parameters``; 4.x in ``rope_scaling``/``rope_theta``."""
    params = getattr(cfg, "rope_parameters", None)
    if params:
        return dict(params)
    params = dict(getattr(cfg, "rope_scaling", None) or {})
    params.setdefault("rope_theta", getattr(cfg, "rope_theta", 10000.0))
    return params
