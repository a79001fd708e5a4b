"""Build a runnable stack (policies + executor + engine) from a composed config."""

from __future__ import annotations

import dataclasses
import logging
import platform
from dataclasses import dataclass

from omegaconf import DictConfig

from servelab.engine.arrival_source import OpenLoop
from servelab.engine.clock import ModelledClock, WallClock
from servelab.core.cost_model import StepCostModel
from servelab.core.errors import ConfigError
from servelab.engine.engine import Engine
from servelab.engine.frontend import DelayedArrivals, FrontEnd
from servelab.core.contexts import EngineClock, KVClusterLink, KVConnectorContext, PredictorContext, TimeModelContext
from servelab.core.executor import Executor
from servelab.core.expert_placement import ExpertPlacementContext
from servelab.core.expert_cache import ExpertCacheContext
from servelab.assemble.expert_cache import cache_context
from servelab.core.interfaces import EngineLimits, TimeModel
from servelab.core.kinds import KindSpec, build_context, build_order, instantiate
from servelab.core.registry import Registry, default_registry
from servelab.core.shapes import ModelShape
from servelab.config.engine import engine_host, engine_summary
from servelab.kv.connectors import build_kv_connector, find_part
from servelab.kv.tiers.build import kv_tier_specs, tiers_wanted
from servelab.kv.tiers.host_memory import host_memory
from servelab.kv.tiers.store import TieredKVConnector
from servelab.kv.tiers.view import StoreView
from servelab.assemble.block_size import resolve_block_size
from servelab.workloads.arrivals import arrival_source, is_closed_loop
from servelab.assemble.executor import (build_executor, build_sim_executor, executor_context, hardware_profile,  # noqa: F401
                                        model_path, model_shape, placement_context, plugin_config, storage_bytes,
                                        worker_config)
from servelab.assemble.validate import (check_block_size, check_engine_timing, check_packaged_model,  # noqa: F401
                                        check_required, clock_kind, explicit_block_size, option_value, validate)

_clock_kind, _plugin_config = clock_kind, plugin_config  # the names before servelab 0.1's layout (one release)

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
    engine_preset: dict | None = None  # engine=<preset>: what summary.json states (servelab.config.engine)

    def describe_time(self) -> dict:
        """What ``summary.json`` states about time: the clock, the time model, the hardware."""
        if self.clock_kind == "virtual":  # a profile states the machine it measured, a roofline its spec sheet
            assert self.time_model is not None  # a virtual clock runs on a time model
            hardware = getattr(self.time_model, "hardware_label", None) or self.time_model.context.hardware.name
        else:
            hardware = f"this machine ({platform.machine()}, {self.executor.__class__.__name__})"
        timing = getattr(self.time_model, "timing_summary", None) if self.clock_kind == "virtual" else None
        if timing is None and self.clock_kind == "virtual":  # time_model=roofline: its MoE figures, if any
            timing = getattr(self.time_model, "moe_summary", None)
        return {"clock": self.clock_kind, "time_model": self.time_model.describe() if self.time_model else None,
                "hardware": hardware, **({"engine": self.engine_preset} if self.engine_preset else {}),
                **(timing() if timing is not None else {})}


def build_stack(cfg: DictConfig, registry: Registry | None = None, executor: Executor | None = None,
                clock=None, requests=None, connector=None, shared_tiers=None,
                cluster: KVClusterLink | None = None) -> Stack:
    """Validate ``cfg``, build the executor (unless given) and every engine-scope plugin kind in
    the order their contexts need (:func:`servelab.core.kinds.build_order`), and wire the engine.

    Each plugin is ``cls(config, context)``, its context filled by field name from the run's values
    and the plugins built before it. ``block_size=auto`` is resolved first (``cfg.block_size`` becomes
    the chosen size) from ``requests`` (the run's; built from ``cfg.workload`` when None).
    The KV connector is the ``kv_connector`` kind's (:mod:`servelab.kv.connectors`: the cluster's
    hand-off, the tiers ``kv_tiers`` configures, the selected one; composed through ``multi`` when
    several); ``connector``: one the caller built, asked first. ``cluster``: this engine's place in a
    cluster (:class:`~servelab.core.contexts.KVClusterLink`: its index, role, the KV transport and the
    shared tiers); ``shared_tiers``: the shared tiers alone (a cluster without a hand-off)."""
    validate(cfg)
    auto = resolve_block_size(cfg, model_shape(cfg), requests) if cfg.block_size == "auto" else None
    registry = registry or default_registry()
    kinds = build_order("engine")
    classes = {k.name: registry.get(k.name, cfg[k.group].name) for k in kinds}
    configs = {k.name: plugin_config(cfg[k.group]) for k in kinds}
    clock_mode = clock_kind(cfg)
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
        non_chunked_schedule=option_value(cfg.get("non_chunked_schedule", "prefill_first")),
        num_scheduler_steps=cfg.get("num_scheduler_steps", 1),
        ttft_slo_ms=cfg.slo.ttft_ms, tpot_slo_ms=cfg.slo.tpot_ms)
    cost_model = StepCostModel(bytes_per_block=executor.bytes_per_block)
    if cluster is None and shared_tiers is not None:
        cluster = KVClusterLink(shared_tiers=shared_tiers)
    tiers = kv_tier_specs(cfg, executor.bytes_per_block, cluster.shared_tiers if cluster is not None else None)
    wants_tiers = tiers_wanted(cfg, classes["kv_tier_policy"], tiers)
    memory = host_memory(tiers, executor) if wants_tiers else None
    engine_clock = EngineClock()
    available: dict = {
        "limits": limits, "cost_model": cost_model, "executor": executor, "connector": connector,
        "num_blocks": executor.num_kv_blocks, "block_size": cfg.block_size,
        "num_swap_blocks": executor.num_swap_blocks, "seed": cfg.seed, "max_model_len": max_model_len,
        "kv_tiers": tiers, "bytes_per_block": executor.bytes_per_block, "kv_pool": executor.kv_pool,
        "clock": engine_clock, "cluster": cluster, "kv_tier_disk_dir": _disk_dir(cfg),
        "kv_tier_load": _tier_load(cfg),
        "computes_tokens": executor.computes_tokens, "at_close": executor.at_shutdown,
        "host_memory": memory, "host_blocks": memory.swap_slots() if memory is not None else None,
    }
    tier_view = StoreView(None) if wants_tiers else None  # the policy's view: the store, once built
    if tier_view is not None:
        available["tier_view"] = tier_view
    if memory is not None:  # the swap pool is the host memory's blocks
        available["num_swap_blocks"] = memory.num_blocks
    prebuilt = {TimeModelContext: time_model_context(cfg, executor, memory.link_gb_s if memory is not None else None),
                ExpertPlacementContext: placement_context(executor.shape, cfg, registry,
                                                          simulated=not executor.computes_tokens),
                ExpertCacheContext: cache_context(executor.shape, cfg, placement_context(executor.shape, cfg, registry)
                                                  .slots_per_rank, registry, simulated=not executor.computes_tokens),
                PredictorContext: PredictorContext(
                    model_name=cfg.model.name, model_path=None if cfg.model.path is None else str(cfg.model.path),
                    vocab_size=executor.spec.vocab_size, max_model_len=max_model_len, seed=cfg.seed)}
    plugins: dict = {}
    for kind in kinds:
        context = prebuilt.get(kind.context) or build_context(kind, available)
        if kind.context in prebuilt:  # a prebuilt context's fields that name a plugin built before it
            context = _with_plugins(context, plugins)
        if kind.name == "kv_connector":  # none, one, or several composed: servelab.kv.connectors
            assert isinstance(context, KVConnectorContext)
            plugins[kind.name] = build_kv_connector(cfg, registry, context, wants_tiers, given=connector)
        else:
            plugins[kind.name] = _build(kind, classes[kind.name], configs[kind.name], context, cfg)
        available[kind.name] = plugins[kind.name]
        available.update({alias: plugins[kind.name] for alias in kind.provides})
        if kind.name == "allocator" and tier_view is not None:
            tier_view.attach(plugins["allocator"])  # before the store subscribes: an eviction reaches the view first
        if kind.name == "time_model":
            # On the virtual clock the host link is the time model's, not a copy timed now on this machine.
            _swap_bandwidth(cfg, executor, cost_model, plugins["time_model"].swap_bytes_per_s()
                            if clock_mode == "virtual" and clock is None else None)
    connector = plugins["kv_connector"]
    store = find_part(connector, TieredKVConnector)
    if store is not None and tier_view is not None:
        tier_view.store = store
    drafter = plugins["drafter"]
    if drafter.num_speculative_tokens and not executor.computes_tokens:
        raise ConfigError(f"drafter={cfg.drafter.name}: backend={cfg.backend.name} computes no tokens, so there is "
                          "nothing to verify drafts against; use drafter=none with backend=sim")
    _check_timing_priced(cfg, plugins["time_model"], clock_mode)
    frontend = frontend_model(cfg)
    if clock is None:
        clock = (ModelledClock(plugins["time_model"], frontend.step_cost_s(1)) if clock_mode == "virtual"
                 else WallClock())
    else:
        clock_mode = "custom"
    if store is not None and clock_mode == "virtual":
        store.use_clock(clock.now)
    engine = Engine(limits, plugins["scheduler"], plugins["allocator"], executor, cost_model, seed=cfg.seed,
                    clock=clock, drafter=drafter, **({"connector": connector} if connector is not None else {}))
    engine_clock.bind(engine.now)
    engine.fast_forward_enabled = bool(cfg.sim.fast_forward)
    if frontend.delays_tokens:
        engine.frontend = frontend
    return Stack(engine, executor, limits, plugins["time_model"], clock_mode,
                 {"chosen": auto.chosen, "reason": auto.reason} if auto else None, plugins,
                 engine_summary(cfg.engine) if "engine" in cfg else None)


def _with_plugins(context, plugins: dict):
    """``context`` with each field named after a plugin built so far set to that plugin."""
    return dataclasses.replace(context, **{f.name: plugins[f.name] for f in dataclasses.fields(context)
                                           if f.name in plugins})


def _disk_dir(cfg: DictConfig) -> str | None:
    node = cfg.get("kv_tiers")
    return node.get("disk_dir") if node is not None else None


def _tier_load(cfg: DictConfig) -> str:
    node = cfg.get("kv_tiers")
    return str(option_value(node.load)) if node is not None else "overlap"


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
    """``sim.cuda_graphs`` / ``sim.all_reduce`` and an engine preset's host model are priced operator by
    operator: refuse a time model that cannot."""
    if clock_kind != "virtual" or getattr(time_model, "timing_summary", None) is not None:
        return
    if cfg.sim.cuda_graphs or option_value(cfg.sim.all_reduce) != "nccl":
        raise ConfigError(f"sim.cuda_graphs / sim.all_reduce price a step operator by operator; time_model="
                          f"{cfg.time_model.name} prices whole steps: use time_model=auto, op_profile or "
                          "calibrated_roofline")
    host = engine_host(cfg.engine) if "engine" in cfg else None
    if host is not None and host.changes_pricing:
        raise ConfigError(f"engine={cfg.engine.name} prices the host's time apart from the GPU's (engine.host, "
                          f"engine.overlap); time_model={cfg.time_model.name} prices whole steps: use time_model=auto, "
                          "op_profile or calibrated_roofline (or engine=servelab)")


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


def time_model_context(cfg: DictConfig, executor: Executor, host_link_gb_s: float | None = None) -> TimeModelContext:
    """``host_link_gb_s``: the host link swaps cross when they share the host tier's memory (its
    bandwidth: one pricing); None: the hardware's."""
    shape = executor.shape
    hardware = hardware_profile(cfg)
    if host_link_gb_s is not None:
        hardware = dataclasses.replace(hardware, host_link_gb_s=host_link_gb_s)
    dtype = option_value(cfg.model.dtype)
    name = cfg.model.name if cfg.model.path is None else str(cfg.model.path)
    sizes = storage_bytes(cfg)
    return TimeModelContext(shape=shape, hardware=hardware, tensor_parallel_size=cfg.tensor_parallel_size,
                            dtype=dtype, weight_dtype_bytes=sizes.weight, kv_dtype_bytes=sizes.kv,
                            block_size=cfg.block_size, model_name=name, linear_weight_bytes=sizes.linear,
                            kv_scale_bytes=sizes.kv_scale, draft_shape=_draft_shape(executor),
                            cuda_graph_sizes=tuple(cfg.sim.cuda_graph_sizes) if cfg.sim.cuda_graphs else (),
                            all_reduce=option_value(cfg.sim.all_reduce),
                            engine_host=engine_host(cfg.engine) if "engine" in cfg else None,
                            **_moe_settings(cfg), **_pipeline_settings(cfg))


def _pipeline_settings(cfg: DictConfig) -> dict:
    """``pipeline_parallel_size`` and the node size its stages are laid on (nothing at 1 stage)."""
    pp = cfg.get("pipeline_parallel_size", 1)
    if pp == 1:
        return {}
    return dict(pipeline_parallel_size=pp, gpus_per_node=cfg.cluster.gpus_per_node)


def _moe_settings(cfg: DictConfig) -> dict:
    """``expert_parallel_size`` and ``sim.moe`` for a MoE model's time model (a dense model's ignores them)."""
    moe = cfg.sim.get("moe")
    if moe is None:
        return {}
    return dict(expert_parallel_size=cfg.get("expert_parallel_size", 1), moe_routing_skew=float(moe.routing_skew),
                moe_seed=int(moe.seed), moe_routing_trace=moe.routing_trace,
                moe_ep_exchange=moe.get("ep_exchange", "all_to_all"),
                **({"data_parallel_attention": True} if cfg.get("data_parallel_attention", False) else {}))


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
