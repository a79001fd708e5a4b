"""``expert_cache=<name>`` and ``sim.moe.expert_cache_slots`` from a run's config: the cache's context, and
the expert bytes one rank does not hold on the GPU (the memory plan gives them to the KV pool)."""

from __future__ import annotations

from omegaconf import DictConfig

from servelab.core.errors import ConfigError
from servelab.core.expert_cache import ExpertCacheContext
from servelab.core.registry import Registry, default_registry
from servelab.core.shapes import ModelShape


def _slots_key(cfg: DictConfig) -> int:
    return int(cfg.sim.get("moe", {}).get("expert_cache_slots", 0) or 0) if "sim" in cfg else 0


def cache_slots(cfg: DictConfig, shape: ModelShape, experts_per_rank: int, registry: Registry | None = None,
                simulated: bool = True) -> int:
    """Experts per rank and MoE layer resident on the GPU (``experts_per_rank`` when nothing is offloaded);
    bad combinations are one line naming the key."""
    node = cfg.get("expert_cache")
    slots = _slots_key(cfg)
    name = node.name if node is not None else "none"
    all_resident = node is None or bool((registry or default_registry()).get("expert_cache", name).all_resident)
    if all_resident:
        if slots:
            raise ConfigError(f"sim.moe.expert_cache_slots={slots} needs an expert cache (expert_cache=lru|lfu|"
                              f"prefetch); expert_cache={name} keeps every expert on the GPU")
        return experts_per_rank
    if not shape.is_moe:
        raise ConfigError(f"expert_cache={name} needs a mixture-of-experts model (this one is dense)")
    if not simulated:
        raise ConfigError(f"expert_cache={name} is priced by the simulator only (backend=sim); "
                          f"backend={cfg.backend.name} keeps every expert on the GPU")
    pp = int(cfg.get("pipeline_parallel_size", 1) or 1)
    if pp > 1:  # the offloaded bytes are one rank's over every MoE layer; a stage holds only its own layers
        raise ConfigError(f"expert_cache={name} with pipeline_parallel_size={pp} is not modelled (the cache and its "
                          "memory plan cover every MoE layer on each rank); use pipeline_parallel_size=1")
    if not 1 <= slots <= experts_per_rank:
        raise ConfigError(f"expert_cache={name} needs sim.moe.expert_cache_slots in 1..{experts_per_rank} (the "
                          f"experts of each rank's share kept on the GPU per MoE layer), got {slots}")
    return slots


def cache_context(shape: ModelShape, cfg: DictConfig, experts_per_rank: int, registry: Registry | None = None,
                  simulated: bool = True) -> ExpertCacheContext:
    """What ``expert_cache=<name>`` is built with (``experts_per_rank``: the placement's slots per rank)."""
    moe = shape.is_moe
    return ExpertCacheContext(num_experts=shape.num_experts if moe else 0,
                              num_moe_layers=shape.num_moe_layers if moe else 0,
                              expert_parallel_size=cfg.get("expert_parallel_size", 1),
                              experts_per_rank=experts_per_rank if moe else 0,
                              cache_slots=cache_slots(cfg, shape, experts_per_rank, registry, simulated) if moe else 0,
                              seed=cfg.seed)


def offloaded_expert_bytes(cfg: DictConfig, shape: ModelShape, experts_per_rank: int, expert_bytes: float,
                           registry: Registry | None = None) -> float:
    """One rank's expert weights kept in host memory: ``experts_per_rank - cache_slots`` shards of
    ``expert_bytes`` in every MoE layer (0 under ``expert_cache=none``)."""
    if not shape.is_moe:
        cache_slots(cfg, shape, 0, registry)  # a cache on a dense model: one line
        return 0.0
    return (experts_per_rank - cache_slots(cfg, shape, experts_per_rank, registry)) * shape.num_moe_layers * \
        expert_bytes
