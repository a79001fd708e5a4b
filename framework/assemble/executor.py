"""The executor a run needs (``backend=<name>``), and what it is built from: the checkpoint's path and shape,
the worker's settings, the simulator's memory plan, the host swap pool, the bytes each value takes."""

from __future__ import annotations

import dataclasses
import logging

from omegaconf import DictConfig, OmegaConf

from servelab.engine.drafting import MAX_DRAFT_TOKENS, scratch_blocks_per_seq
from servelab.core.errors import ConfigError
from servelab.core.contexts import ExecutorContext
from servelab.core.executor import Executor
from servelab.core.expert_placement import ExpertPlacementContext
from servelab.assemble.expert_cache import offloaded_expert_bytes
from servelab.core.kinds import KINDS, instantiate
from servelab.exec.worker_config import WorkerConfig
from servelab.exec.model.random_checkpoint import cached_random_checkpoint, moe_config_kwargs
from servelab.core.registry import Registry, default_registry
from servelab.core.shapes import HardwareProfile, ModelShape, StorageBytes
from servelab.sim.executor import plan_memory
from servelab.assemble.swap_pool import swap_pool_config
from servelab.assemble.validate import check_packaged_model, option_value

log = logging.getLogger(__name__)




def model_path(cfg: DictConfig) -> str:
    """The checkpoint directory: ``model.path`` or the embedded tiny model (written once)."""
    check_packaged_model(cfg)
    m = cfg.model
    if m.name == "hf" and m.path is None:  # (validate says so too; eval-ppl comes here directly)
        raise ConfigError("model=hf needs model.path: add model.path=<checkpoint dir>")
    if m.shape_only:
        raise ConfigError(f"model={m.name} is a shape from the catalogue (no weights): run it with backend=sim, "
                          "or give a real checkpoint with model=hf model.path=<dir>")
    if m.path is not None:
        return str(m.path)
    shape = {k: m[k] for k in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                               "num_key_value_heads", "vocab_size", "max_position_embeddings",
                               "tie_word_embeddings", "initializer_range")}
    if m.get("head_dim"):
        shape["head_dim"] = m.head_dim
    if m.get("num_experts"):  # the random tiny MoE model (model=tiny_moe): its MoE fields, under HF's names
        try:
            shape.update(moe_config_kwargs(m.architecture, m.num_experts, m.num_experts_per_tok,
                                           m.moe_intermediate_size, m.moe_layer_step, m.norm_topk_prob))
        except ValueError as exc:
            raise ConfigError(f"model.architecture={m.architecture} with model.num_experts={m.num_experts}: {exc}") \
                from None
    return str(cached_random_checkpoint(m.architecture, m.weights_seed, shape))


def _swap_pool(cfg: DictConfig, registry: Registry | None = None) -> tuple[int, float | None]:
    """(num_swap_blocks, swap_space_gb): configured, or the default pool of a policy that swaps; with
    tiers on, the host memory it shares with the host tier."""
    registry = registry or default_registry()
    policy = registry.get("preemption", cfg.preemption.name)
    return swap_pool_config(cfg, getattr(policy, "uses_host_pool", False), shared_host_tier(cfg, registry))


def shared_host_tier(cfg: DictConfig, registry: Registry | None = None) -> tuple[int, float] | None:
    """``(index, capacity_gib)`` of the host tier the swap pool shares one host memory with: tiers on (a
    ``kv_tier_policy`` that stores) and a host tier of this engine's own (not a cluster's shared one)."""
    node = cfg.get("kv_tiers")
    if node is None or "kv_tier_policy" not in cfg:
        return None
    if not (registry or default_registry()).get("kv_tier_policy", cfg.kv_tier_policy.name).stores:
        return None
    for i, tier in enumerate(node.tiers):
        if str(getattr(tier.kind, "value", tier.kind)) == "host" and not tier.shared:
            return i, float(tier.capacity_gib)
    return None


def worker_config(cfg: DictConfig, registry: Registry | None = None) -> WorkerConfig:
    num_swap_blocks, swap_space_gb = _swap_pool(cfg, registry)
    return WorkerConfig(
        model_path=model_path(cfg),
        dtype=option_value(cfg.model.dtype),
        device=cfg.backend.device,
        attention_backend=option_value(cfg.attention_backend),
        block_size=cfg.block_size,
        max_model_len=cfg.max_model_len,
        num_kv_blocks=cfg.num_kv_blocks,
        kv_cache_memory_gb=cfg.backend.kv_cache_memory_gb,
        gpu_memory_utilization=cfg.backend.gpu_memory_utilization,
        num_swap_blocks=num_swap_blocks,
        seed=cfg.seed,
        swap_space_gb=swap_space_gb,
        quantization=option_value(cfg.model.get("quantization", "none")),
        kv_cache_dtype=option_value(cfg.get("kv_cache_dtype", "auto")),
    )


def model_shape(cfg: DictConfig) -> ModelShape:
    """The model's sizes without loading weights: ``model.path``'s config.json, else the config fields."""
    m = cfg.model
    if m.path is not None:
        return ModelShape.from_config_json(m.path)
    moe = {} if not m.get("num_experts") else dict(
        num_experts=m.num_experts, experts_per_token=m.num_experts_per_tok, moe_intermediate_size=m.moe_intermediate_size,
        num_shared_experts=m.num_shared_experts, shared_expert_intermediate_size=m.shared_expert_intermediate_size or 0,
        first_dense_layers=m.first_dense_layers, moe_layer_step=m.moe_layer_step)
    mla = {} if not m.get("kv_lora_rank") else {k: m[k] for k in ("kv_lora_rank", "q_lora_rank", "qk_rope_head_dim",
                                                                 "qk_nope_head_dim", "v_head_dim")}
    return ModelShape(num_layers=m.num_hidden_layers, hidden_size=m.hidden_size, intermediate_size=m.intermediate_size,
                      num_heads=m.num_attention_heads, num_kv_heads=m.num_key_value_heads,
                      head_dim=m.get("head_dim") or m.hidden_size // m.num_attention_heads, vocab_size=m.vocab_size,
                      tie_word_embeddings=m.tie_word_embeddings, max_position_embeddings=m.max_position_embeddings,
                      **moe, **mla)


def parallel_sizes(cfg: DictConfig) -> tuple[int, int]:
    """``(expert_parallel_size, pipeline_parallel_size)``, checked against the model's shape (EP on a
    dense model, more stages than layers ...: one line naming the key)."""
    ep, pp = cfg.get("expert_parallel_size", 1), cfg.get("pipeline_parallel_size", 1)
    if ep != 1 or pp != 1:
        model_shape(cfg).check_parallel(cfg.tensor_parallel_size, ep, pp)
    return ep, pp


def dp_attention(cfg: DictConfig, shape: ModelShape) -> bool:
    """``data_parallel_attention`` (the config's other checks are :func:`servelab.assemble.validate.validate`'s);
    a dense model (a ``model.path`` the config could not tell) is one line naming the key."""
    on = bool(cfg.get("data_parallel_attention", False))
    if on and not shape.is_moe:
        raise ConfigError("data_parallel_attention=true needs a mixture-of-experts model (this one is dense)")
    return on


def hardware_profile(cfg: DictConfig) -> HardwareProfile:
    return HardwareProfile.from_config(cfg.hardware)


def executor_context(cfg: DictConfig, registry: Registry | None = None, draft_model_path: str | None = None,
                     sim: bool | None = None) -> ExecutorContext:
    """What ``backend=<executor>`` is built with: the worker settings of a real backend, or (``sim``,
    default ``backend=sim``) the simulator's shape, hardware and memory plan; the host swap pool either way."""
    num_swap_blocks, swap_space_gb = _swap_pool(cfg, registry)
    ep, pp = parallel_sizes(cfg)
    if not (cfg.backend.name == "sim" if sim is None else sim):
        check_placement_backend(cfg)
    common = dict(model_name=cfg.model.name, tensor_parallel_size=cfg.tensor_parallel_size,
                  num_kv_blocks=cfg.num_kv_blocks, num_swap_blocks=num_swap_blocks, swap_space_gb=swap_space_gb,
                  expert_parallel_size=ep, pipeline_parallel_size=pp)
    if cfg.backend.name == "sim" if sim is None else sim:
        shape, hardware = model_shape(cfg), hardware_profile(cfg)
        sizes = storage_bytes(cfg)
        memory = plan_memory(shape, hardware, cfg.tensor_parallel_size, sizes.weight, sizes.kv, cfg.block_size,
                             cfg.backend.gpu_memory_utilization, cfg.backend.activation_reserve_gb,
                             sizes.linear, sizes.kv_scale, ep=ep, pp=pp,
                             redundant_expert_bytes=redundant_expert_bytes(cfg, shape, registry)
                             - offloaded_bytes(cfg, shape, registry),
                             dp_attention=dp_attention(cfg, shape))
        return ExecutorContext(**common, shape=shape, hardware=hardware, memory=memory)
    wcfg = worker_config(cfg, registry)
    if draft_model_path is not None:
        k = cfg.drafter.get("k", MAX_DRAFT_TOKENS)
        wcfg = dataclasses.replace(wcfg, draft_model_path=draft_model_path,
                                   draft_scratch_blocks=cfg.max_num_seqs * scratch_blocks_per_seq(k, cfg.block_size))
    return ExecutorContext(**common, worker=wcfg, draft_model_path=draft_model_path)


def build_sim_executor(cfg: DictConfig, registry: Registry | None = None) -> Executor:
    """The simulator's executor for ``cfg`` (``backend=sim`` or not: a what-if of the same run)."""
    from servelab.sim.executor import SimExecutor  # noqa: PLC0415 - what backend=sim registers

    return SimExecutor(plugin_config(cfg.backend), executor_context(cfg, registry, sim=True))


def build_executor(cfg: DictConfig, draft_model_path: str | None = None, registry: Registry | None = None) -> Executor:
    """The executor ``backend=<name>`` names, built like any plugin; ``draft_model_path``: a draft
    checkpoint to load beside the target; ``registry``: where it and the preemption policy are
    looked up (default: the installed plugins)."""
    registry = registry or default_registry()
    spec = next(k for k in KINDS.values() if k.scope == "executor")
    cls = registry.get(spec.name, cfg[spec.group].name)
    if cfg.backend.num_threads and cls.computes_tokens:
        import torch  # noqa: PLC0415 - a backend that computes tokens loads it anyway; the simulator never does

        torch.set_num_threads(cfg.backend.num_threads)
    return instantiate(spec, cls, plugin_config(cfg[spec.group]), executor_context(cfg, registry, draft_model_path))


def redundant_experts(cfg: DictConfig, shape: ModelShape, registry: Registry | None = None) -> int:
    """Expert replicas beyond one per expert that ``expert_placement=<name>`` holds, over all ranks (0 for a
    dense model); a count that does not divide over the ranks is one line naming the key."""
    node = cfg.get("expert_placement")
    if node is None or not shape.is_moe:
        return 0
    cls = (registry or default_registry()).get("expert_placement", node.name)
    extra = int(cls.redundant_experts(plugin_config(node)))
    ep = cfg.get("expert_parallel_size", 1)
    if extra < 0 or extra % ep:
        raise ConfigError(f"expert_placement={node.name}: {extra} redundant experts must be a multiple of "
                          f"expert_parallel_size={ep} (every rank holds the same slots)")
    return extra


def redundant_expert_bytes(cfg: DictConfig, shape: ModelShape, registry: Registry | None = None) -> float:
    """The weights one rank holds for its share of the placement's redundant experts, every MoE layer
    (each a ``moe_intermediate_size / (tp / ep)`` shard of gate, up and down)."""
    extra = redundant_experts(cfg, shape, registry)
    if not extra:
        return 0.0
    ep, tp = cfg.get("expert_parallel_size", 1), cfg.tensor_parallel_size
    sizes = storage_bytes(cfg)
    per_expert = 3 * shape.hidden_size * shape.moe_intermediate_size / (tp // ep) * (sizes.linear or sizes.weight)
    return extra // ep * shape.num_moe_layers * per_expert


def offloaded_bytes(cfg: DictConfig, shape: ModelShape, registry: Registry | None = None) -> float:
    """The expert weights one rank keeps in host memory under ``expert_cache=<name>`` (0 by default):
    the memory plan holds only the cached experts (:mod:`servelab.assemble.expert_cache`)."""
    if not shape.is_moe:
        return offloaded_expert_bytes(cfg, shape, 0, 0.0, registry)
    ep, tp = cfg.get("expert_parallel_size", 1), cfg.tensor_parallel_size
    sizes = storage_bytes(cfg)
    per_expert = 3 * shape.hidden_size * shape.moe_intermediate_size / (tp // ep) * (sizes.linear or sizes.weight)
    return offloaded_expert_bytes(cfg, shape, placement_context(shape, cfg, registry).slots_per_rank, per_expert,
                                  registry)


def check_placement_backend(cfg: DictConfig, is_moe: bool | None = None) -> None:
    """A placement other than ``linear`` on a real backend is one line: only the simulator prices it.
    ``is_moe``: the model's shape says so (None: the config's ``model.num_experts``)."""
    node = cfg.get("expert_placement")
    moe = bool(cfg.model.get("num_experts")) if is_moe is None else is_moe
    if node is not None and node.name != "linear" and moe:
        raise ConfigError(f"expert_placement={node.name} is priced by the simulator only (backend=sim); "
                          f"backend={cfg.backend.name}'s expert parallelism places experts linearly")


def placement_context(shape: ModelShape, cfg: DictConfig, registry: Registry | None = None,
                      simulated: bool = True) -> ExpertPlacementContext:
    """What ``expert_placement=<name>`` is built with: the model's experts and MoE layers, the ranks and
    the slots each holds (replicas included). ``simulated``: the executor is the simulator's (else only
    ``linear`` is accepted)."""
    ep = cfg.get("expert_parallel_size", 1)
    if not simulated:
        check_placement_backend(cfg, shape.is_moe)
    slots = (shape.num_experts + redundant_experts(cfg, shape, registry)) // ep if shape.is_moe else 0
    return ExpertPlacementContext(num_experts=shape.num_experts if shape.is_moe else 0,
                                  num_moe_layers=shape.num_moe_layers if shape.is_moe else 0,
                                  expert_parallel_size=ep, slots_per_rank=slots, seed=cfg.seed)


def storage_bytes(cfg: DictConfig) -> StorageBytes:
    """Bytes per stored weight and KV value under ``model.dtype``, ``model.quantization``, ``kv_cache_dtype``."""
    return StorageBytes.of(option_value(cfg.model.dtype), option_value(cfg.model.get("quantization", "none")),
                           option_value(cfg.get("kv_cache_dtype", "auto")))


def plugin_config(node: DictConfig):
    """The plugin's typed config object (its ``Config`` dataclass, with ``name``)."""
    return OmegaConf.to_object(node)
