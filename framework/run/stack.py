"""Build a runnable stack (policies + executor + engine) from a composed config."""

from __future__ import annotations

import dataclasses
import logging
import platform
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from servelab.engine.arrival_source import OpenLoop
from servelab.engine.clock import ModelledClock, WallClock
from servelab.core.cost_model import StepCostModel
from servelab.engine.drafting import MAX_DRAFT_TOKENS, scratch_blocks_per_seq
from servelab.core.errors import ConfigError
from servelab.engine.engine import Engine
from servelab.engine.frontend import DelayedArrivals, FrontEnd
from servelab.core.contexts import ExecutorContext, PredictorContext, TimeModelContext
from servelab.core.executor import Executor
from servelab.core.interfaces import EngineLimits, TimeModel
from servelab.core.kinds import KINDS, KindSpec, build_context, build_order, instantiate
from servelab.exec.worker_config import WorkerConfig
from servelab.core.packaged import PACKAGED_CHECKPOINTS, PACKAGED_MODELS
from servelab.exec.model.random_checkpoint import cached_random_checkpoint
from servelab.core.registry import Registry, default_registry
from servelab.core.shapes import HardwareProfile, ModelShape, StorageBytes
from servelab.sim.executor import plan_memory
from servelab.run.kv_tier_build import kv_tier_specs, tier_load_clock, tiered_store
from servelab.run.block_size import resolve_block_size
from servelab.run.config import check_known_keys
from servelab.run.preflight import check_device
from servelab.run.swap_pool import swap_pool_config
from servelab.workloads.arrivals import arrival_source, check_closed_loop, is_closed_loop

log = logging.getLogger(__name__)


@dataclass
class Stack:
    engine: Engine
    executor: Executor
    limits: EngineLimits
    time_model: TimeModel | None = None
    clock_kind: str = "wall"  # wall | virtual | custom (a clock handed in by the caller)
    block_size_auto: dict | None = None  # block_size=auto: {"chosen": size, "reason": why}
    plugins: dict = dataclasses.field(default_factory=dict)  # kind -> the engine-scope plugin built for it

    def describe_time(self) -> dict:
        """What ``summary.json`` states about time: the clock, the time model, the hardware."""
        if self.clock_kind == "virtual":  # a profile states the machine it measured, a roofline its spec sheet
            assert self.time_model is not None  # a virtual clock runs on a time model
            hardware = getattr(self.time_model, "hardware_label", None) or self.time_model.context.hardware.name
        else:
            hardware = f"this machine ({platform.machine()}, {self.executor.__class__.__name__})"
        timing = getattr(self.time_model, "timing_summary", None) if self.clock_kind == "virtual" else None
        return {"clock": self.clock_kind, "time_model": self.time_model.describe() if self.time_model else None,
                "hardware": hardware, **(timing() if timing is not None else {})}


def validate(cfg: DictConfig) -> None:
    """Cross-key checks Hydra's types cannot express; raise :class:`ConfigError` naming the key."""
    check_required(cfg)
    check_known_keys(cfg)  # a Python API config too: the CLI's composer already said it in one line
    check_device(cfg)
    check_packaged_model(cfg)
    check_closed_loop(cfg.workload)
    bs = check_block_size(cfg.block_size)
    if cfg.max_num_seqs < 1:
        raise ConfigError(f"max_num_seqs={cfg.max_num_seqs} must be >= 1")
    if cfg.max_model_len < 2:
        raise ConfigError(f"max_model_len={cfg.max_model_len} must be >= 2")
    if cfg.max_num_batched_tokens < max(bs, cfg.max_num_seqs):  # auto: only sizes that fit are candidates
        raise ConfigError(f"max_num_batched_tokens={cfg.max_num_batched_tokens} must be >= block_size ({bs}) and "
                          f">= max_num_seqs ({cfg.max_num_seqs}, one token per running sequence)")
    if not cfg.chunked_prefill and cfg.max_num_batched_tokens < cfg.max_model_len:
        raise ConfigError(f"chunked_prefill=false needs max_num_batched_tokens ({cfg.max_num_batched_tokens}) >= "
                          f"max_model_len ({cfg.max_model_len}) so any prompt fits one step")
    steps = cfg.get("num_scheduler_steps", 1)
    if steps < 1:
        raise ConfigError(f"num_scheduler_steps={steps} must be >= 1 (1 = schedule every step)")
    if steps > 1 and cfg.drafter.name != "none":
        raise ConfigError(f"num_scheduler_steps={steps} with drafter={cfg.drafter.name}: multi-step windows run "
                          "plain decodes only (vLLM refuses the pair too); use num_scheduler_steps=1")
    if cfg.num_kv_blocks is not None and cfg.num_kv_blocks < 1:
        raise ConfigError(f"num_kv_blocks={cfg.num_kv_blocks} must be >= 1 (or null to size from memory)")
    if cfg.tensor_parallel_size < 1:
        raise ConfigError(f"tensor_parallel_size={cfg.tensor_parallel_size} must be >= 1")
    if cfg.backend.tp_step_timeout_s <= 0:
        raise ConfigError(f"backend.tp_step_timeout_s={cfg.backend.tp_step_timeout_s} must be > 0")
    swap_blocks = cfg.backend.get("num_swap_blocks")
    if swap_blocks is not None and swap_blocks < 0:
        raise ConfigError(f"backend.num_swap_blocks={swap_blocks} must be >= 0")
    swap_gb = cfg.backend.get("swap_space_gb")
    if swap_gb is not None and (swap_gb < 0 or swap_blocks is not None):
        raise ConfigError(f"backend.swap_space_gb={swap_gb} must be >= 0 and is exclusive with "
                          f"backend.num_swap_blocks={swap_blocks} (set one of them)")
    bandwidth = cfg.backend.get("swap_bandwidth_gb_s")
    if bandwidth is not None and bandwidth <= 0:
        raise ConfigError(f"backend.swap_bandwidth_gb_s={bandwidth} must be > 0 (or null to measure it)")
    for key in ("ttft_ms", "tpot_ms"):
        value = cfg.slo[key]
        if value is not None and value <= 0:
            raise ConfigError(f"slo.{key}={value} must be > 0")
    if cfg.backend.get("activation_reserve_gb", 0) < 0:
        raise ConfigError(f"backend.activation_reserve_gb={cfg.backend.activation_reserve_gb} must be >= 0")
    if cfg.backend.kv_cache_memory_gb <= 0:
        raise ConfigError(f"backend.kv_cache_memory_gb={cfg.backend.kv_cache_memory_gb} must be > 0")
    check_engine_timing(cfg)


def check_engine_timing(cfg: DictConfig) -> None:
    """``sim.cuda_graphs`` / ``sim.cuda_graph_sizes`` / ``sim.all_reduce`` and ``frontend.*``: valid
    values, and only where they are priced (the virtual clock; the real model is measured as it is)."""
    sizes = list(cfg.sim.cuda_graph_sizes)
    if cfg.sim.cuda_graphs and (not sizes or min(sizes) < 1):
        raise ConfigError(f"sim.cuda_graph_sizes={sizes} must list batch sizes >= 1 (sim.cuda_graphs=true)")
    fe = cfg.frontend
    for key in ("per_request_s", "per_prompt_token_s", "per_output_token_s"):
        if fe[key] < 0:
            raise ConfigError(f"frontend.{key}={fe[key]} must be >= 0")
    if cfg.backend.name == "sim" or _value(cfg.clock) == "virtual":
        return
    if cfg.sim.cuda_graphs or _value(cfg.sim.all_reduce) != "nccl":
        raise ConfigError(f"sim.cuda_graphs / sim.all_reduce price steps on the virtual clock; backend="
                          f"{cfg.backend.name} on the wall clock is measured as it runs: drop them or use backend=sim")
    if any(fe[k] for k in ("per_request_s", "per_prompt_token_s", "per_output_token_s")) or fe.in_engine_process:
        raise ConfigError(f"frontend={fe.name}: the front-end model prices the virtual clock; backend="
                          f"{cfg.backend.name} on the wall clock is measured as it runs (servelab serve measures "
                          "the real server): use frontend=none or backend=sim")


def explicit_block_size(cfg: DictConfig, command: str) -> int:
    """``cfg.block_size`` for a command that runs no workload (so ``auto`` has nothing to choose from)."""
    bs = check_block_size(cfg.block_size)
    if cfg.block_size == "auto":
        raise ConfigError(f"block_size=auto chooses from a workload's lengths, and {command} runs none: "
                          "give block_size=<int>")
    return bs


def check_block_size(bs) -> int:
    """``block_size``: a power of two 1..256 (returned), or ``auto`` (returned as 1: resolved later)."""
    if bs == "auto":
        return 1
    if not isinstance(bs, int) or isinstance(bs, bool) or bs < 1 or bs > 256 or bs & (bs - 1):
        raise ConfigError(f"block_size={bs} must be a power of two between 1 and 256, or auto")
    return bs


def check_required(cfg: DictConfig) -> None:
    """A key the chosen option needs but nobody set (``workload=jsonl`` without ``workload.path``,
    ``model=hf`` without ``model.path``): one line naming it, not a traceback at first use."""
    missing = [k for k in OmegaConf.missing_keys(cfg) if not k.startswith("hydra.")]
    if cfg.model.name == "hf" and cfg.model.path is None:  # hf's ??? merges onto the schema's null
        missing.insert(0, "model.path")
    if not missing:
        return
    key = missing[0]
    group = key.split(".", 1)[0]
    option = OmegaConf.select(cfg, f"{group}.name", default=None) if "." in key else None
    needs = f"{group}={option} needs {key}" if option else f"{key} is required"
    what = "<checkpoint dir>" if key == "model.path" else "<file>" if key.endswith("path") else "<value>"
    more = f" (also unset: {', '.join(missing[1:])})" if len(missing) > 1 else ""
    raise ConfigError(f"{needs}: add {key}={what}{more}")


def check_packaged_model(cfg: DictConfig) -> None:
    """``model=tiny_code`` (a shipped checkpoint) with ``model.path`` pointing elsewhere would run the
    other checkpoint with the shipped one's name, context (``max_model_len``) and thread count: refuse."""
    m = cfg.model
    if m.name not in PACKAGED_MODELS or m.path is None:
        return
    shipped = PACKAGED_CHECKPOINTS / m.name
    if Path(str(m.path)).expanduser().resolve() != shipped.resolve():
        raise ConfigError(f"model.path={m.path} with model={m.name}: model={m.name} is the shipped checkpoint (its "
                          f"name, max_model_len and backend.num_threads); for your own checkpoint use "
                          f"model=hf model.path={m.path}")


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
    return str(cached_random_checkpoint(m.architecture, m.weights_seed, shape))


def _swap_pool(cfg: DictConfig, registry: Registry | None = None) -> tuple[int, float | None]:
    """(num_swap_blocks, swap_space_gb): configured, or the default pool of a policy that swaps."""
    policy = (registry or default_registry()).get("preemption", cfg.preemption.name)
    return swap_pool_config(cfg, getattr(policy, "uses_host_pool", False))


def worker_config(cfg: DictConfig, registry: Registry | None = None) -> WorkerConfig:
    num_swap_blocks, swap_space_gb = _swap_pool(cfg, registry)
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
        num_swap_blocks=num_swap_blocks,
        seed=cfg.seed,
        swap_space_gb=swap_space_gb,
        quantization=_value(cfg.model.get("quantization", "none")),
        kv_cache_dtype=_value(cfg.get("kv_cache_dtype", "auto")),
    )


def model_shape(cfg: DictConfig) -> ModelShape:
    """The model's sizes without loading weights: ``model.path``'s config.json, else the config fields."""
    m = cfg.model
    if m.path is not None:
        return ModelShape.from_config_json(m.path)
    return ModelShape(num_layers=m.num_hidden_layers, hidden_size=m.hidden_size, intermediate_size=m.intermediate_size,
                      num_heads=m.num_attention_heads, num_kv_heads=m.num_key_value_heads,
                      head_dim=m.hidden_size // m.num_attention_heads, vocab_size=m.vocab_size,
                      tie_word_embeddings=m.tie_word_embeddings, max_position_embeddings=m.max_position_embeddings)


def hardware_profile(cfg: DictConfig) -> HardwareProfile:
    return HardwareProfile.from_config(cfg.hardware)


def executor_context(cfg: DictConfig, registry: Registry | None = None, draft_model_path: str | None = None,
                     sim: bool | None = None) -> ExecutorContext:
    """What ``backend=<executor>`` is built with: the worker settings of a real backend, or (``sim``,
    default ``backend=sim``) the simulator's shape, hardware and memory plan; the host swap pool either way."""
    num_swap_blocks, swap_space_gb = _swap_pool(cfg, registry)
    common = dict(model_name=cfg.model.name, tensor_parallel_size=cfg.tensor_parallel_size,
                  num_kv_blocks=cfg.num_kv_blocks, num_swap_blocks=num_swap_blocks, swap_space_gb=swap_space_gb)
    if cfg.backend.name == "sim" if sim is None else sim:
        shape, hardware = model_shape(cfg), hardware_profile(cfg)
        sizes = storage_bytes(cfg)
        memory = plan_memory(shape, hardware, cfg.tensor_parallel_size, sizes.weight, sizes.kv, cfg.block_size,
                             cfg.backend.gpu_memory_utilization, cfg.backend.activation_reserve_gb,
                             sizes.linear, sizes.kv_scale)
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

    return SimExecutor(_plugin_config(cfg.backend), executor_context(cfg, registry, sim=True))


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
    return instantiate(spec, cls, _plugin_config(cfg[spec.group]), executor_context(cfg, registry, draft_model_path))


def build_stack(cfg: DictConfig, registry: Registry | None = None, executor: Executor | None = None,
                clock=None, requests=None, connector=None, shared_tiers=None) -> Stack:
    """Validate ``cfg``, build the executor (unless given) and every engine-scope plugin kind in
    the order their contexts need (:func:`servelab.core.kinds.build_order`), and wire the engine.

    Each plugin is ``cls(config, context)``, its context filled by field name from the run's values
    and the plugins built before it. ``block_size=auto`` is resolved first (``cfg.block_size`` becomes
    the chosen size) from ``requests`` (the run's; built from ``cfg.workload`` when None).
    ``connector``: the KV connector through which KV enters or leaves this engine (None: none).
    ``shared_tiers``: a cluster's shared KV tiers (:class:`servelab.run.kv_tier_shared.SharedTiers`)."""
    validate(cfg)
    auto = resolve_block_size(cfg, model_shape(cfg), requests) if cfg.block_size == "auto" else None
    registry = registry or default_registry()
    kinds = build_order("engine")
    classes = {k.name: registry.get(k.name, cfg[k.group].name) for k in kinds}
    configs = {k.name: _plugin_config(cfg[k.group]) for k in kinds}
    clock_kind = _clock_kind(cfg)
    _check_length_predictor(cfg, classes)
    if executor is None:
        executor = build_executor(cfg, _draft_model_path(cfg, classes["drafter"], configs["drafter"]), registry)
    if executor.num_kv_blocks < 1:
        raise ConfigError("the KV pool has no blocks: raise backend.kv_cache_memory_gb or set num_kv_blocks")
    max_model_len = min(cfg.max_model_len, executor.spec.max_position_embeddings)
    if max_model_len < cfg.max_model_len:
        log.warning("max_model_len=%d capped to the model's max_position_embeddings=%d", cfg.max_model_len,
                    max_model_len)
    limits = EngineLimits(
        block_size=cfg.block_size, max_num_seqs=cfg.max_num_seqs, max_num_batched_tokens=cfg.max_num_batched_tokens,
        max_model_len=max_model_len, chunked_prefill=cfg.chunked_prefill,
        non_chunked_schedule=_value(cfg.get("non_chunked_schedule", "prefill_first")),
        num_scheduler_steps=cfg.get("num_scheduler_steps", 1),
        ttft_slo_ms=cfg.slo.ttft_ms, tpot_slo_ms=cfg.slo.tpot_ms)
    cost_model = StepCostModel(bytes_per_block=executor.bytes_per_block)
    available: dict = {
        "limits": limits, "cost_model": cost_model, "executor": executor, "connector": connector,
        "num_blocks": executor.num_kv_blocks, "block_size": cfg.block_size,
        "num_swap_blocks": executor.num_swap_blocks, "seed": cfg.seed, "max_model_len": max_model_len,
    }
    tiers = kv_tier_specs(cfg, executor.bytes_per_block, shared_tiers)
    store = tiered_store(cfg, classes["kv_tier_policy"], tiers, executor, connector, shared_tiers)
    if store is not None:
        connector = available["connector"] = store
    available.update(kv_tiers=tiers, bytes_per_block=executor.bytes_per_block)
    prebuilt = {TimeModelContext: time_model_context(cfg, executor),
                PredictorContext: PredictorContext(
                    model_name=cfg.model.name, model_path=None if cfg.model.path is None else str(cfg.model.path),
                    vocab_size=executor.spec.vocab_size, max_model_len=max_model_len, seed=cfg.seed)}
    plugins: dict = {}
    for kind in kinds:
        context = prebuilt.get(kind.context) or build_context(kind, available)
        plugins[kind.name] = available[kind.name] = _build(kind, classes[kind.name], configs[kind.name], context, cfg)
        if kind.name == "time_model":
            # On the virtual clock the host link is the time model's, not a copy timed now on this machine.
            _swap_bandwidth(cfg, executor, cost_model, plugins["time_model"].swap_bytes_per_s()
                            if clock_kind == "virtual" and clock is None else None)
    if store is not None:
        store.bind(plugins["kv_tier_policy"], plugins["allocator"])
    drafter = plugins["drafter"]
    if drafter.num_speculative_tokens and not executor.computes_tokens:
        raise ConfigError(f"drafter={cfg.drafter.name}: backend={cfg.backend.name} computes no tokens, so there is "
                          "nothing to verify drafts against; use drafter=none with backend=sim")
    _check_timing_priced(cfg, plugins["time_model"], clock_kind)
    frontend = frontend_model(cfg)
    if clock is None:
        clock = (ModelledClock(plugins["time_model"], frontend.step_cost_s(1)) if clock_kind == "virtual"
                 else WallClock())
    else:
        clock_kind = "custom"
    if store is not None and clock_kind == "virtual":
        clock = tier_load_clock(cfg, clock, store)
    if store is not None:
        scheduler = plugins["scheduler"]
        store.watch(lambda: [*getattr(scheduler, "kv_waiting", ()), *getattr(scheduler, "waiting", ())], clock.now if clock_kind == "virtual" else None)
    engine = Engine(limits, plugins["scheduler"], plugins["allocator"], executor, cost_model, seed=cfg.seed,
                    clock=clock, drafter=drafter, **({"connector": connector} if connector is not None else {}))
    engine.fast_forward_enabled = bool(cfg.sim.fast_forward)
    if frontend.delays_tokens:
        engine.frontend = frontend
    return Stack(engine, executor, limits, plugins["time_model"], clock_kind,
                 {"chosen": auto.chosen, "reason": auto.reason} if auto else None, plugins)


def frontend_model(cfg: DictConfig) -> FrontEnd:
    """The ``frontend`` config as a :class:`~servelab.engine.frontend.FrontEnd` (all zero: ``frontend=none``)."""
    fe = cfg.frontend
    return FrontEnd(float(fe.per_request_s), float(fe.per_prompt_token_s), float(fe.per_output_token_s),
                    bool(fe.in_engine_process))


def run_arrivals(cfg: DictConfig, requests):
    """The arrival source :func:`~servelab.run.runner.run_workload` feeds from: the workload's
    (open loop at its times, or ``workload.arrival=closed_loop`` clients) as requests reach the
    engine behind ``cfg.frontend``."""
    if not is_closed_loop(cfg.workload):
        return OpenLoop(engine_arrivals(cfg, requests), cfg.workload.time_scale)
    source = arrival_source(cfg.workload, requests)
    frontend = frontend_model(cfg)
    return DelayedArrivals(source, frontend) if frontend.delays_requests else source


def engine_arrivals(cfg: DictConfig, requests):
    """``requests`` as they reach the engine behind ``cfg.frontend`` (unchanged without request costs)."""
    frontend = frontend_model(cfg)
    return frontend.arrivals(requests, cfg.workload.time_scale) if frontend.delays_requests else requests


def _check_timing_priced(cfg: DictConfig, time_model: TimeModel, clock_kind: str) -> None:
    """``sim.cuda_graphs`` / ``sim.all_reduce`` are priced operator by operator: refuse a time model that cannot."""
    if clock_kind != "virtual" or not (cfg.sim.cuda_graphs or _value(cfg.sim.all_reduce) != "nccl"):
        return
    if getattr(time_model, "timing_summary", None) is None:
        raise ConfigError(f"sim.cuda_graphs / sim.all_reduce price a step operator by operator; time_model="
                          f"{cfg.time_model.name} prices whole steps: use time_model=auto, op_profile or "
                          "calibrated_roofline")


def _build(kind: KindSpec, cls: type, config, context, cfg: DictConfig):
    """One plugin; a ``ValueError`` from its constructor (a bad setting) is a one-line config error
    naming the option."""
    try:
        return instantiate(kind, cls, config, context)
    except ValueError as exc:  # ConfigError too: it gets the option's name unless it says it
        where = f"{kind.group}={cfg[kind.group].name}"
        raise ConfigError(str(exc) if str(exc).startswith((f"{kind.group}=", "sim.")) else f"{where}: {exc}") from None


def _check_length_predictor(cfg: DictConfig, classes: dict) -> None:
    """A scheduler that orders by predicted output length needs a predictor that predicts."""
    if not classes["length_predictor"].predicts and classes["scheduler"].needs_length_predictor:
        raise ConfigError(f"scheduler={cfg.scheduler.name} orders requests by predicted output length, but "
                          f"length_predictor={cfg.length_predictor.name}: choose one, e.g. length_predictor=oracle "
                          f"(the true length) or length_predictor=learned")


def _draft_model_path(cfg: DictConfig, drafter_class, drafter_config) -> str | None:
    """The draft checkpoint the drafter needs loaded beside the target, if any (never in the sim)."""
    if cfg.backend.name == "sim":
        return None
    return drafter_class.model_path(drafter_config, model_path(cfg))


def _clock_kind(cfg: DictConfig) -> str:
    """``clock=auto`` resolved, and the combinations of clock, backend and time model checked."""
    kind = _value(cfg.clock)
    sim = cfg.backend.name == "sim"
    if kind == "auto":
        kind = "virtual" if sim else "wall"
    tm = cfg.time_model.name
    if sim and kind == "wall":
        raise ConfigError("backend=sim has no wall time to measure: use clock=virtual (or clock=auto)")
    if kind == "wall" and tm != "measured":
        raise ConfigError(f"time_model={tm} prices steps on the virtual clock: add clock=virtual "
                          "(on clock=wall steps are timed as they run: time_model=measured)")
    if kind == "virtual" and tm == "measured":
        raise ConfigError("clock=virtual needs a time model that predicts step times: time_model=roofline "
                          "(hardware=<name>) or time_model=profile time_model.path=<profile.json>")
    return kind


def storage_bytes(cfg: DictConfig) -> StorageBytes:
    """Bytes per stored weight and KV value under ``model.dtype``, ``model.quantization``, ``kv_cache_dtype``."""
    return StorageBytes.of(_value(cfg.model.dtype), _value(cfg.model.get("quantization", "none")),
                           _value(cfg.get("kv_cache_dtype", "auto")))


def time_model_context(cfg: DictConfig, executor: Executor) -> TimeModelContext:
    shape = executor.shape
    dtype = _value(cfg.model.dtype)
    name = cfg.model.name if cfg.model.path is None else str(cfg.model.path)
    sizes = storage_bytes(cfg)
    return TimeModelContext(shape=shape, hardware=hardware_profile(cfg), tensor_parallel_size=cfg.tensor_parallel_size,
                            dtype=dtype, weight_dtype_bytes=sizes.weight, kv_dtype_bytes=sizes.kv,
                            block_size=cfg.block_size, model_name=name, linear_weight_bytes=sizes.linear,
                            kv_scale_bytes=sizes.kv_scale, draft_shape=_draft_shape(executor),
                            cuda_graph_sizes=tuple(cfg.sim.cuda_graph_sizes) if cfg.sim.cuda_graphs else (),
                            all_reduce=_value(cfg.sim.all_reduce))


def _draft_shape(executor: Executor) -> ModelShape | None:
    """The draft model's shape when the executor loaded one beside the target (drafter=draft_model)."""
    return executor.draft_shape


def _swap_bandwidth(cfg: DictConfig, executor: Executor, cost_model: StepCostModel,
                    modelled_bytes_per_s: float | None = None) -> None:
    """The policies' cost model learns the host link's speed: configured, else the time model's
    on the virtual clock, else measured now (when there is a host pool to swap to)."""
    bandwidth = cfg.backend.get("swap_bandwidth_gb_s")
    if bandwidth is not None:
        cost_model.swap_bytes_per_s = bandwidth * 1e9
    elif modelled_bytes_per_s:
        cost_model.swap_bytes_per_s = modelled_bytes_per_s
    elif executor.num_swap_blocks > 0:
        cost_model.swap_bytes_per_s = executor.measure_swap_bandwidth()
        log.info("swap bandwidth measured at start-up: %.2f GB/s", cost_model.swap_bytes_per_s / 1e9)


def _plugin_config(node: DictConfig):
    """The plugin's typed config object (its ``Config`` dataclass, with ``name``)."""
    return OmegaConf.to_object(node)


def _value(v):
    return getattr(v, "value", v)
