"""Build a runnable stack (policies + executor + engine) from a composed config."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
from omegaconf import DictConfig, OmegaConf

from .cost_model import StepCostModel
from .errors import ConfigError
from .engine import Engine
from .executor import Executor, LocalExecutor, WorkerConfig
from .interfaces import EngineLimits
from .model.random_checkpoint import cached_random_checkpoint
from .registry import Registry, default_registry

log = logging.getLogger(__name__)


@dataclass
class Stack:
    engine: Engine
    executor: Executor
    limits: EngineLimits


def validate(cfg: DictConfig) -> None:
    """Cross-key checks Hydra's types cannot express; raise :class:`ConfigError` naming the key."""
    bs = cfg.block_size
    if bs < 1 or bs > 256 or bs & (bs - 1):
        raise ConfigError(f"block_size={bs} must be a power of two between 1 and 256")
    if cfg.max_num_seqs < 1:
        raise ConfigError(f"max_num_seqs={cfg.max_num_seqs} must be >= 1")
    if cfg.max_model_len < 2:
        raise ConfigError(f"max_model_len={cfg.max_model_len} must be >= 2")
    if cfg.max_num_batched_tokens < max(bs, cfg.max_num_seqs):
        raise ConfigError(f"max_num_batched_tokens={cfg.max_num_batched_tokens} must be >= block_size ({bs}) and "
                          f">= max_num_seqs ({cfg.max_num_seqs}, one token per running sequence)")
    if not cfg.chunked_prefill and cfg.max_num_batched_tokens < cfg.max_model_len:
        raise ConfigError(f"chunked_prefill=false needs max_num_batched_tokens ({cfg.max_num_batched_tokens}) >= "
                          f"max_model_len ({cfg.max_model_len}) so any prompt fits one step")
    if cfg.num_kv_blocks is not None and cfg.num_kv_blocks < 1:
        raise ConfigError(f"num_kv_blocks={cfg.num_kv_blocks} must be >= 1 (or null to size from memory)")
    if cfg.tensor_parallel_size < 1:
        raise ConfigError(f"tensor_parallel_size={cfg.tensor_parallel_size} must be >= 1")
    if cfg.backend.tp_step_timeout_s <= 0:
        raise ConfigError(f"backend.tp_step_timeout_s={cfg.backend.tp_step_timeout_s} must be > 0")
    if cfg.backend.num_swap_blocks < 0:
        raise ConfigError(f"backend.num_swap_blocks={cfg.backend.num_swap_blocks} must be >= 0")
    swap_gb = cfg.backend.get("swap_space_gb")
    if swap_gb is not None and (swap_gb < 0 or cfg.backend.num_swap_blocks):
        raise ConfigError(f"backend.swap_space_gb={swap_gb} must be >= 0 and is exclusive with "
                          f"backend.num_swap_blocks={cfg.backend.num_swap_blocks} (set one of them)")
    bandwidth = cfg.backend.get("swap_bandwidth_gb_s")
    if bandwidth is not None and bandwidth <= 0:
        raise ConfigError(f"backend.swap_bandwidth_gb_s={bandwidth} must be > 0 (or null to measure it)")
    for key in ("ttft_ms", "tpot_ms"):
        value = cfg.slo[key]
        if value is not None and value <= 0:
            raise ConfigError(f"slo.{key}={value} must be > 0")
    if cfg.backend.kv_cache_memory_gb <= 0:
        raise ConfigError(f"backend.kv_cache_memory_gb={cfg.backend.kv_cache_memory_gb} must be > 0")


def model_path(cfg: DictConfig) -> str:
    """The checkpoint directory: ``model.path`` or the embedded tiny model (written once)."""
    m = cfg.model
    if m.path is not None:
        return str(m.path)
    shape = {k: m[k] for k in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                               "num_key_value_heads", "vocab_size", "max_position_embeddings",
                               "tie_word_embeddings", "initializer_range")}
    return str(cached_random_checkpoint(m.architecture, m.weights_seed, shape))


def worker_config(cfg: DictConfig) -> WorkerConfig:
    return WorkerConfig(
        model_path=model_path(cfg),
        dtype=_value(cfg.model.dtype),
        device=cfg.backend.device,
        attention_backend=_value(cfg.attention_backend),
        block_size=cfg.block_size,
        max_model_len=cfg.max_model_len,
        num_kv_blocks=cfg.num_kv_blocks,
        kv_cache_memory_gb=cfg.backend.kv_cache_memory_gb,
        gpu_memory_utilization=cfg.backend.gpu_memory_utilization,
        num_swap_blocks=cfg.backend.num_swap_blocks,
        seed=cfg.seed,
        swap_space_gb=cfg.backend.get("swap_space_gb"),
    )


def build_executor(cfg: DictConfig) -> Executor:
    if cfg.backend.num_threads:
        torch.set_num_threads(cfg.backend.num_threads)
    wcfg = worker_config(cfg)
    if cfg.tensor_parallel_size > 1:
        from .tp import TPExecutor  # noqa: PLC0415 - optional, heavier

        return TPExecutor(wcfg, cfg.tensor_parallel_size, step_timeout_s=cfg.backend.tp_step_timeout_s,
                          num_threads=cfg.backend.num_threads)
    return LocalExecutor(wcfg)


def build_stack(cfg: DictConfig, registry: Registry | None = None, executor: Executor | None = None,
                clock=None) -> Stack:
    """Validate ``cfg``, build the executor (unless given) and the policies, and wire the engine."""
    validate(cfg)
    registry = registry or default_registry()
    classes = {kind: registry.get(kind, cfg[kind].name) for kind in ("scheduler", "allocator", "preemption", "drafter")}
    executor = executor or build_executor(cfg)
    if executor.num_kv_blocks < 1:
        raise ConfigError("the KV pool has no blocks: raise backend.kv_cache_memory_gb or set num_kv_blocks")
    max_model_len = min(cfg.max_model_len, executor.spec.max_position_embeddings)
    if max_model_len < cfg.max_model_len:
        log.warning("max_model_len=%d capped to the model's max_position_embeddings=%d", cfg.max_model_len,
                    max_model_len)
    limits = EngineLimits(
        block_size=cfg.block_size, max_num_seqs=cfg.max_num_seqs, max_num_batched_tokens=cfg.max_num_batched_tokens,
        max_model_len=max_model_len, chunked_prefill=cfg.chunked_prefill,
        ttft_slo_ms=cfg.slo.ttft_ms, tpot_slo_ms=cfg.slo.tpot_ms)
    cost_model = StepCostModel()
    allocator = classes["allocator"](_plugin_config(cfg.allocator), executor.num_kv_blocks, cfg.block_size, limits)
    _attach_swap_pool(cfg, executor, allocator, cost_model)
    preemption = classes["preemption"](_plugin_config(cfg.preemption), limits, allocator, cost_model)
    scheduler = classes["scheduler"](_plugin_config(cfg.scheduler), limits, allocator, preemption, cost_model)
    drafter = classes["drafter"](_plugin_config(cfg.drafter), limits)
    if drafter.num_speculative_tokens:
        raise ConfigError(f"drafter={cfg.drafter.name!r}: speculative decoding is not supported by the engine yet")
    engine = Engine(limits, scheduler, allocator, executor, cost_model, seed=cfg.seed,
                    **({"clock": clock} if clock is not None else {}))
    return Stack(engine, executor, limits)


def _attach_swap_pool(cfg: DictConfig, executor: Executor, allocator, cost_model: StepCostModel) -> None:
    """Tell the allocator the host pool size and the cost model the host link's speed."""
    num_swap_blocks = getattr(executor, "num_swap_blocks", 0)
    allocator.attach_swap_pool(num_swap_blocks)
    cost_model.bytes_per_block = executor.bytes_per_block
    bandwidth = cfg.backend.get("swap_bandwidth_gb_s")
    if bandwidth is not None:
        cost_model.swap_bytes_per_s = bandwidth * 1e9
    elif num_swap_blocks > 0:
        cost_model.swap_bytes_per_s = executor.measure_swap_bandwidth()
        log.info("swap bandwidth measured at start-up: %.2f GB/s", cost_model.swap_bytes_per_s / 1e9)


def _plugin_config(node: DictConfig):
    """The plugin's typed config object (its ``Config`` dataclass, with ``name``)."""
    return OmegaConf.to_object(node)


def _value(v):
    return getattr(v, "value", v)
