"""Write real HF-format checkpoints with random weights (the embedded default model and test models).

The checkpoint is made by transformers itself (``save_pretrained``: config.json + safetensors), so
servelab loads it through the same loader a downloaded checkpoint would take.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

CONFIG_CLASSES = {
    "LlamaForCausalLM": "LlamaConfig",
    "MistralForCausalLM": "MistralConfig",
    "Qwen2ForCausalLM": "Qwen2Config",
    "Qwen3ForCausalLM": "Qwen3Config",
    "MixtralForCausalLM": "MixtralConfig",
    "Qwen3MoeForCausalLM": "Qwen3MoeConfig",
}
ROUTER_STD = 0.5  # router weights: decisive routing (HF starts them at zero: every expert would tie)


def moe_config_kwargs(architecture: str, num_experts: int, num_experts_per_tok: int, moe_intermediate_size: int,
                      moe_layer_step: int = 1, norm_topk_prob: bool = True) -> dict:
    """``model.*``'s MoE fields under the architecture's ``config.json`` names (Mixtral's experts are
    ``intermediate_size`` wide and always renormalise; it has no dense layers)."""
    if architecture == "MixtralForCausalLM":
        if moe_layer_step != 1 or not norm_topk_prob:
            raise ValueError("MixtralForCausalLM: every layer is MoE and renormalises its top-k weights "
                             "(model.moe_layer_step=1, model.norm_topk_prob=true)")
        return {"num_local_experts": num_experts, "num_experts_per_tok": num_experts_per_tok,
                "intermediate_size": moe_intermediate_size}
    if architecture == "Qwen3MoeForCausalLM":
        return {"num_experts": num_experts, "num_experts_per_tok": num_experts_per_tok,
                "moe_intermediate_size": moe_intermediate_size, "decoder_sparse_step": moe_layer_step,
                "norm_topk_prob": norm_topk_prob}
    raise ValueError(f"{architecture} is not a mixture-of-experts architecture; MoE ones: MixtralForCausalLM, "
                     "Qwen3MoeForCausalLM")


def default_cache_dir() -> Path:
    return Path(os.environ.get("SERVELAB_CACHE", Path.home() / ".cache" / "servelab"))


def write_random_checkpoint(path: str | Path, architecture: str = "LlamaForCausalLM", seed: int = 0,
                            **config_kwargs) -> Path:
    """Create ``path`` holding a randomly initialised ``architecture`` model (seeded)."""
    import torch  # noqa: PLC0415 - torch, transformers: only when a checkpoint is written
    import transformers  # noqa: PLC0415

    config_cls = getattr(transformers, CONFIG_CLASSES[architecture])
    model_cls = getattr(transformers, architecture)
    config = config_cls(architectures=[architecture], **config_kwargs)
    torch.manual_seed(seed)
    model = model_cls(config).eval()
    with torch.no_grad():  # HF inits norms to 1 and biases to 0, which would hide bugs in their use
        for name, param in model.named_parameters():
            if "norm" in name:
                param.normal_(1.0, 0.2)
            elif name.endswith("gate.weight") and param.dim() == 2:  # a MoE router
                param.normal_(0.0, ROUTER_STD)
            elif name.endswith("bias"):
                param.normal_(0.0, 0.2)
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path, safe_serialization=True)
    return path


def cached_random_checkpoint(architecture: str, seed: int, config_kwargs: dict,
                             cache_dir: str | Path | None = None) -> Path:
    """The checkpoint for these settings from the cache folder, written once (atomically)."""
    key = json.dumps({"arch": architecture, "seed": seed, **config_kwargs}, sort_keys=True)
    digest = hashlib.sha256(key.encode()).hexdigest()[:12]
    root = Path(cache_dir) if cache_dir else default_cache_dir() / "models"
    target = root / f"{architecture}-{digest}"
    if (target / "config.json").is_file():
        return target
    root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=root, prefix=".tmp-"))
    try:
        write_random_checkpoint(staging, architecture, seed, **config_kwargs)
        (staging / "servelab_random.json").write_text(key)
        try:
            staging.rename(target)
        except OSError:  # another process won the race
            pass
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target
