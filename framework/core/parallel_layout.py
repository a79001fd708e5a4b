"""The parts of a model's shape that a parallel layout reads: the MoE and MLA fields of an HF
``config.json`` under each family's names, vLLM's split of the layers into pipeline stages, and the
checks of ``expert_parallel_size`` / ``pipeline_parallel_size`` against a shape (one line naming the key)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from servelab.core.errors import ConfigError


def pipeline_stages(num_layers: int, pp: int) -> list[range]:
    """vLLM's ``get_pp_indices`` (vllm/distributed/utils.py): ``num_layers // pp`` layers per stage, the
    remainder one more each on the stages before the last."""
    share, extra = divmod(num_layers, pp)
    sizes = [share] * pp
    for i in range(2, extra + 2):
        sizes[-i] += 1
    starts = [sum(sizes[:i]) for i in range(pp)]
    return [range(start, start + size) for start, size in zip(starts, sizes)]


def check_expert_parallel(ep: int, tp: int, num_experts: int, moe_intermediate_size: int) -> None:
    """``expert_parallel_size``: experts split ``ep`` ways over the tensor-parallel ranks (SGLang's
    ``--ep-size``), each expert's MLP ``tp / ep`` ways."""
    if ep < 1:
        raise ConfigError(f"expert_parallel_size={ep} must be >= 1")
    if ep == 1:
        return
    if not num_experts:
        raise ConfigError(f"expert_parallel_size={ep} needs a mixture-of-experts model, and this one is dense "
                          "(no experts in its shape)")
    if tp % ep:
        raise ConfigError(f"expert_parallel_size={ep} must divide tensor_parallel_size={tp}: experts are split "
                          "over the tensor-parallel ranks (each expert's MLP over tensor_parallel_size / "
                          "expert_parallel_size of them)")
    if num_experts % ep:
        raise ConfigError(f"expert_parallel_size={ep} does not divide the model's {num_experts} experts")
    if moe_intermediate_size % (tp // ep):
        raise ConfigError(f"tensor_parallel_size={tp} / expert_parallel_size={ep} does not divide the experts' "
                          f"moe_intermediate_size={moe_intermediate_size}")


def check_pipeline_parallel(pp: int, num_layers: int) -> None:
    if pp < 1:
        raise ConfigError(f"pipeline_parallel_size={pp} must be >= 1")
    if pp > num_layers:
        raise ConfigError(f"pipeline_parallel_size={pp} exceeds the model's {num_layers} layers (each stage "
                          "holds at least one)")


def moe_fields_of(cfg: Mapping[str, Any]) -> dict[str, int]:
    """The MoE and MLA fields of :class:`ModelShape` from an HF ``config.json`` mapping, under each
    family's names: Mixtral (``num_local_experts``; its experts are ``intermediate_size`` wide), Qwen2/3-MoE
    (``num_experts``, ``decoder_sparse_step``, ``shared_expert_intermediate_size``), DeepSeek-V2/V3
    (``n_routed_experts``, ``n_shared_experts``, ``first_k_dense_replace``, ``moe_layer_freq``, MLA's ranks)."""
    experts = cfg.get("num_local_experts") or cfg.get("num_experts") or cfg.get("n_routed_experts") or 0
    shared_width = cfg.get("shared_expert_intermediate_size") or 0
    out = {"num_experts": experts}
    if experts:
        out.update(experts_per_token=cfg.get("num_experts_per_tok") or 0,
                   moe_intermediate_size=cfg.get("moe_intermediate_size") or cfg.get("intermediate_size") or 0,
                   num_shared_experts=cfg.get("n_shared_experts") or (1 if shared_width else 0),
                   shared_expert_intermediate_size=shared_width,
                   first_dense_layers=cfg.get("first_k_dense_replace") or 0,
                   moe_layer_step=cfg.get("decoder_sparse_step") or cfg.get("moe_layer_freq") or 1)
    if cfg.get("kv_lora_rank"):
        out.update({k: cfg.get(k) or 0 for k in ("kv_lora_rank", "q_lora_rank", "qk_rope_head_dim",
                                                   "qk_nope_head_dim", "v_head_dim")})
    return out
