"""A checkpoint's shape as its ``config.json`` gives it, and the config a run records with that shape.

With ``model.path`` set (``model=tiny_code``, ``model=hf``, a ``config.json`` for ``backend=sim``) the
shape fields of ``model.*`` do not apply: the checkpoint's ``config.json`` rules. The composed config
still holds the fields' defaults (``hidden_size: 256`` ...); :func:`recorded_config` puts the
checkpoint's values in their place for the ``config.yaml`` a run writes (``servelab --help`` shows them
through :func:`checkpoint_shape` too), so the record says what ran.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, cast

from omegaconf import DictConfig, OmegaConf

from servelab.core.parallel_layout import moe_fields_of

# config.json keys that are ModelConfig fields (the shape a checkpoint brings)
SHAPE_FIELDS = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
                "vocab_size", "max_position_embeddings", "tie_word_embeddings")
# ModelConfig fields a checkpoint brings where it has them (each family names them its own way in config.json):
# ModelConfig name <- ModelShape name (servelab.core.parallel_layout.moe_fields_of)
MOE_FIELDS = {"num_experts": "num_experts", "num_experts_per_tok": "experts_per_token",
              "moe_intermediate_size": "moe_intermediate_size", "num_shared_experts": "num_shared_experts",
              "shared_expert_intermediate_size": "shared_expert_intermediate_size",
              "first_dense_layers": "first_dense_layers", "moe_layer_step": "moe_layer_step",
              "kv_lora_rank": "kv_lora_rank", "q_lora_rank": "q_lora_rank", "qk_rope_head_dim": "qk_rope_head_dim",
              "qk_nope_head_dim": "qk_nope_head_dim", "v_head_dim": "v_head_dim"}


def checkpoint_shape(path: Any) -> dict | None:
    """The shape fields of the checkpoint at ``path`` (a folder holding ``config.json``, or the file),
    with ``architecture`` first where it names one; None if there is none to read."""
    file = Path(str(path))
    file = file / "config.json" if file.is_dir() else file
    try:
        data = json.loads(file.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict):
        return None
    shape = {k: data[k] for k in SHAPE_FIELDS if k in data}
    if "num_key_value_heads" not in shape and "num_attention_heads" in shape:  # transformers' default: no GQA
        shape["num_key_value_heads"] = shape["num_attention_heads"]
    heads = data.get("num_attention_heads")
    if data.get("head_dim") and heads and data["head_dim"] != data.get("hidden_size", 0) // heads:
        shape["head_dim"] = data["head_dim"]  # only where it is not hidden_size / heads (Qwen3)
    moe = moe_fields_of(data)  # a dense checkpoint: none (the fields' defaults are the dense values)
    shape.update({ours: moe[theirs] for ours, theirs in MOE_FIELDS.items() if moe.get(theirs)})
    if data.get("architectures"):
        shape = {"architecture": data["architectures"][0], **shape}
    return shape


def recorded_config(cfg: DictConfig) -> DictConfig:
    """``cfg`` as a run records it (``config.yaml``): with ``model.path`` set, each ``model.*`` shape field
    is the checkpoint's ``config.json`` value, or null where the file does not give it (the field's
    default does not apply to a checkpoint); else ``cfg`` itself. Resolved, as a plain mapping."""
    path = OmegaConf.select(cfg, "model.path", default=None)
    shape = checkpoint_shape(path) if path else None
    if shape is None:
        return cfg
    plain = cast("dict[str, Any]", OmegaConf.to_container(cfg, resolve=True, enum_to_str=True))
    for key in ("architecture", *SHAPE_FIELDS):
        plain["model"][key] = shape.get(key)
    for key in ("head_dim", *MOE_FIELDS):
        if key in shape:
            plain["model"][key] = shape[key]
    return OmegaConf.create(plain)
