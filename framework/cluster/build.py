"""Build a cluster from a composed config: one stack per replica, the links between them, the router."""

from __future__ import annotations

from pathlib import Path
from typing import cast

from omegaconf import DictConfig, OmegaConf, open_dict

import servelab.conf

from servelab.cluster.autoscale import AutoscaleDriver, AutoscaleSettings
from servelab.cluster.migration import MigrationDriver, MigrationSettings
from servelab.cluster.simulated import Cluster
from servelab.kv.migrate_sim import MigrationLinks
from servelab.kv.pd.sim import PDTransfers
from servelab.cluster.replica import Replica
from servelab.kv.link import kv_link
from servelab.cluster.router import build_autoscaler, build_migration_policy, build_router
from servelab.core.step_work import StepWork
from servelab.core.contexts import KVClusterLink
from servelab.core.errors import ConfigError
from servelab.core.registry import Registry, default_registry
from servelab.core.shapes import HardwareProfile, ModelShape
from servelab.assemble.block_size import resolve_block_size
from servelab.config import HardwareConfig
from servelab.kv.tiers.shared import SharedTiers, check_shared_tiers
from servelab.assemble.executor import model_shape, storage_bytes
from servelab.assemble.stack import Stack, build_stack
from servelab.assemble.validate import clock_kind, validate

POOL_KEYS = ("tensor_parallel_size", "num_kv_blocks", "max_num_seqs", "max_num_batched_tokens", "kv_cache_dtype",
             "block_size")


def is_cluster(cfg: DictConfig) -> bool:
    """Whether ``cfg`` asks for more than today's one engine (an autoscaler may grow one into a cluster)."""
    c = cfg.cluster
    return (c.replicas != 1 or c.prefill_replicas is not None or c.decode_replicas is not None
            or (autoscales(cfg) and (c.max_replicas or 1) > 1))


def autoscales(cfg: DictConfig) -> bool:
    """Whether ``autoscaler=`` names one that scales (not ``none``)."""
    node = cfg.get("autoscaler")
    return node is not None and node.name != "none"


def validate_cluster(cfg: DictConfig) -> None:
    """The ``cluster.*`` keys, each mistake one line naming the key."""
    c = cfg.cluster
    if (c.prefill_replicas is None) != (c.decode_replicas is None):
        given, missing = (("prefill_replicas", "decode_replicas") if c.decode_replicas is None
                          else ("decode_replicas", "prefill_replicas"))
        raise ConfigError(f"cluster.{given}={c[given]} needs cluster.{missing}=<n> as well: a disaggregated cluster "
                          "has a prefill pool and a decode pool")
    if c.replicas < 1:
        raise ConfigError(f"cluster.replicas={c.replicas} must be >= 1")
    if c.gpus_per_node < 1:
        raise ConfigError(f"cluster.gpus_per_node={c.gpus_per_node} must be >= 1")
    if c.prefill_replicas is not None:
        if c.replicas != 1:
            raise ConfigError(f"cluster.replicas={c.replicas} with cluster.prefill_replicas={c.prefill_replicas}: "
                              "set one or the other (replicas = colocated engines; prefill/decode = disaggregated)")
        for key in ("prefill_replicas", "decode_replicas"):
            if c[key] < 1:
                raise ConfigError(f"cluster.{key}={c[key]} must be >= 1")
        if cfg.backend.name != "sim" and clock_kind(cfg) == "virtual":
            raise ConfigError("cluster.prefill_replicas/decode_replicas with a real model move real KV between engine "
                              "processes on the wall clock: drop clock=virtual (backend=sim prices the hand-off)")
        if cfg.backend.name != "sim":
            for pool in ("prefill", "decode"):
                tp = c[pool].tensor_parallel_size or cfg.tensor_parallel_size
                if tp != 1:
                    raise ConfigError(f"cluster.{pool} has tensor_parallel_size={tp}: a prefill/decode engine "
                                      "process moves its KV from one worker's pool, so real prefill/decode runs "
                                      "tensor_parallel_size=1 (backend=sim prices larger ones)")
            if cfg.get("pipeline_parallel_size", 1) != 1:
                raise ConfigError(f"pipeline_parallel_size={cfg.pipeline_parallel_size} with cluster.prefill_replicas/"
                                  "decode_replicas: a prefill/decode engine process moves its KV from one worker's "
                                  "pool, so real prefill/decode runs pipeline_parallel_size=1")
    _validate_migration(cfg)
    _validate_autoscale(cfg)
    check_shared_tiers(cfg)
    clock_kind(cfg)  # the clock, backend and time model agree (wall: engine processes; virtual: one loop)


def _validate_migration(cfg: DictConfig) -> None:
    """The ``cluster.migration_*`` and draining keys, each mistake one line naming the key."""
    c = cfg.cluster
    if c.migration_interval_s <= 0:
        raise ConfigError(f"cluster.migration_interval_s={c.migration_interval_s} must be > 0")
    if c.migration_stop_blocks < 0:
        raise ConfigError(f"cluster.migration_stop_blocks={c.migration_stop_blocks} must be >= 0")
    if c.migration_max_stages < 0:
        raise ConfigError(f"cluster.migration_max_stages={c.migration_max_stages} must be >= 0")
    replicas = c.replicas if c.prefill_replicas is None else c.prefill_replicas + c.decode_replicas
    bad = [i for i in c.draining if not 0 <= i < replicas]
    if bad:
        raise ConfigError(f"cluster.draining={list(c.draining)}: {bad} not replica indices (0..{replicas - 1})")
    node = cfg.get("migration_policy")
    if node is None or node.name == "none":
        if c.draining:
            raise ConfigError(f"cluster.draining={list(c.draining)} empties replicas by migrating their requests: "
                              "choose a migration_policy that moves them (drain, llumnix)")
        return
    if c.prefill_replicas is not None:
        raise ConfigError(f"migration_policy={node.name} moves requests between colocated replicas "
                          "(cluster.replicas=<n>); with prefill/decode pools keep migration_policy=none")
    if cfg.backend.name != "sim":
        if clock_kind(cfg) != "wall":
            raise ConfigError(f"migration_policy={node.name} with a real model moves real KV between engine "
                              "processes on the wall clock: drop clock=virtual (backend=sim prices migrations)")
        if cfg.tensor_parallel_size != 1 or cfg.get("pipeline_parallel_size", 1) != 1:
            raise ConfigError(f"migration_policy={node.name} on engine processes moves a request's KV from one "
                              "worker's pool: run tensor_parallel_size=1 and pipeline_parallel_size=1 "
                              "(backend=sim prices larger ones)")


def _validate_autoscale(cfg: DictConfig) -> None:
    """The ``cluster.*`` autoscaling keys and what an autoscaler runs with, each mistake one line."""
    c = cfg.cluster
    for key in ("autoscale_interval_s", "cold_start_gb_s"):
        if c[key] <= 0:
            raise ConfigError(f"cluster.{key}={c[key]} must be > 0")
    if c.warm_pool < 0:
        raise ConfigError(f"cluster.warm_pool={c.warm_pool} must be >= 0")
    low, high = replica_bounds(cfg)
    if not 1 <= low <= c.replicas <= high:
        raise ConfigError(f"cluster.min_replicas={low}, cluster.replicas={c.replicas}, cluster.max_replicas={high}: "
                          "needs 1 <= min_replicas <= replicas (the initial size) <= max_replicas")
    if not autoscales(cfg):
        return
    name = cfg.autoscaler.name
    if c.prefill_replicas is not None:
        raise ConfigError(f"autoscaler={name} grows and shrinks colocated replicas (cluster.replicas=<n>); with "
                          "prefill/decode pools keep autoscaler=none")
    if cfg.backend.name != "sim":
        raise ConfigError(f"autoscaler={name} runs on the simulator's cluster (backend=sim); engine processes do "
                          "not scale: keep autoscaler=none")
    if c.draining:
        raise ConfigError(f"cluster.draining={list(c.draining)} with autoscaler={name}: the autoscaler drains "
                          "replicas itself; drop cluster.draining")


def replica_bounds(cfg: DictConfig) -> tuple[int, int]:
    """``(cluster.min_replicas, cluster.max_replicas)``, each ``cluster.replicas`` when null."""
    c = cfg.cluster
    return (c.replicas if c.min_replicas is None else c.min_replicas,
            c.replicas if c.max_replicas is None else c.max_replicas)


def cluster_pools(cfg: DictConfig) -> list[tuple[str, int, DictConfig]]:
    """``(role, count, config)`` of each pool: the prefill and the decode pool, or the mixed replicas."""
    c = cfg.cluster
    if c.prefill_replicas is not None:
        return [("prefill", c.prefill_replicas, pool_config(cfg, "prefill")),
                ("decode", c.decode_replicas, pool_config(cfg, "decode"))]
    return [("mixed", replica_bounds(cfg)[1] if autoscales(cfg) else c.replicas, cfg)]


def pool_config(cfg: DictConfig, pool: str) -> DictConfig:
    """``cfg`` with the non-null keys of ``cluster.<pool>`` (``hardware`` names a conf/hardware option)."""
    out = cfg.copy()
    node = cfg.cluster[pool]
    with open_dict(out):
        for key in POOL_KEYS:
            if node[key] is not None:
                out[key] = node[key]
        if node.hardware is not None:
            option = _hardware_option(node.hardware, f"cluster.{pool}.hardware")
            out.hardware = OmegaConf.merge(OmegaConf.structured(HardwareConfig), option)
    return out


def _hardware_option(name: str, key: str) -> DictConfig:
    folder = Path(servelab.conf.__file__).parent / "hardware"
    path = folder / f"{name}.yaml"
    if not path.is_file():
        options = sorted(p.stem for p in folder.glob("*.yaml"))
        raise ConfigError(f"{key}={name} is not a hardware option; options: {', '.join(options)}")
    return cast(DictConfig, OmegaConf.load(path))  # a hardware option is a mapping


def build_cluster(cfg: DictConfig, requests=None, registry: Registry | None = None) -> tuple[Cluster, list[Stack]]:
    """The simulator's cluster (the virtual clock; :mod:`servelab.cluster.procs.cluster` runs a wall-clock one).
    Validate, then build every replica's stack (pools shaped by ``cluster.prefill`` / ``.decode``),
    check that a prompt's KV can move between the pools, price the links, and build the router.
    The caller shuts the stacks' executors down."""
    validate(cfg)
    validate_cluster(cfg)
    if clock_kind(cfg) != "virtual":
        raise ConfigError("build_cluster builds the simulator's cluster, on the virtual clock (clock=virtual); on the "
                          "wall clock a cluster is engine processes: run it with run.py, servelab.LLM.run() or "
                          "servelab.run.cluster_run.run_cluster_job")
    registry = registry or default_registry()
    resolve_block_size(cfg, model_shape(cfg), requests)  # once for every replica (no-op unless auto)
    c = cfg.cluster
    pools = cluster_pools(cfg)
    stacks: list[Stack] = []
    replicas: list[Replica] = []
    transfers = PDTransfers() if c.prefill_replicas is not None else None  # kv_connector=pd_sim's books
    policy = build_migration_policy(cfg, sum(count for _, count, _ in pools), registry)
    moves = MigrationLinks({}, 0.0) if type(policy).moves_requests else None  # kv_connector=migrate_sim's books
    transport, hand_off = (transfers, "pd_sim") if transfers is not None else (moves, "migrate_sim" if moves else "")
    shared_tiers = SharedTiers.of(cfg)  # one book per shared KV tier, for every replica
    gpu = 0
    try:
        for role, count, pcfg in pools:
            tp = pcfg.tensor_parallel_size
            if tp > c.gpus_per_node:
                raise ConfigError(f"{role} replicas have tensor_parallel_size={tp}, more than cluster.gpus_per_node="
                                  f"{c.gpus_per_node}: a tensor-parallel group stays on one node")
            width = tp * cfg.get("pipeline_parallel_size", 1)  # its GPUs: pipeline stages of tp ranks each
            for _ in range(count):
                if gpu % c.gpus_per_node + min(width, c.gpus_per_node) > c.gpus_per_node:  # it would straddle: next node
                    gpu += c.gpus_per_node - gpu % c.gpus_per_node
                link = KVClusterLink(len(replicas), role, transport, hand_off, shared_tiers)
                stack = build_stack(pcfg, registry, requests=requests, cluster=link)
                stacks.append(stack)
                replicas.append(Replica(len(replicas), stack.engine, pcfg.hardware.name, gpu, role=role,
                                        tensor_parallel_size=tp))
                gpu += width
        links, kv_bytes, layers = {}, 0.0, 1
        if c.prefill_replicas is not None:
            prefill_cfg, decode_cfg = pools[0][2], pools[1][2]
            shape = check_kv_compatible(prefill_cfg, decode_cfg)
            kv_bytes, layers = kv_bytes_per_token(prefill_cfg, shape), shape.num_layers
            links = _links(cfg, replicas, HardwareProfile.from_config(prefill_cfg.hardware),
                           HardwareProfile.from_config(decode_cfg.hardware))
        if moves is not None:
            shape = model_shape(cfg)
            moves.kv_bytes_per_token = kv_bytes_per_token(cfg, shape)
            moves.links = _all_links(cfg, replicas, HardwareProfile.from_config(cfg.hardware))
        router = build_router(cfg, [r.view(True) for r in replicas], registry)
    except BaseException:
        for stack in stacks:
            stack.executor.shutdown()
        raise
    cluster = Cluster(replicas, router, links, kv_bytes, layers, c.overlap_kv_transfer, transfers)
    if moves is not None:
        cluster.migration = MigrationDriver(cluster, policy, moves, migration_settings(cfg))
    if autoscales(cfg):
        settings = autoscale_settings(cfg, stacks[0])
        autoscaler = build_autoscaler(cfg, {
            "min_replicas": settings.min_replicas, "max_replicas": settings.max_replicas,
            "interval_s": settings.interval_s, "cold_start_s": settings.cold_start_s,
            "prefill_tokens_per_s": prefill_tokens_per_s(stacks[0])}, registry)
        cluster.autoscale = AutoscaleDriver(cluster, autoscaler, settings)
    return cluster, stacks


def autoscale_settings(cfg: DictConfig, stack: Stack) -> AutoscaleSettings:
    """The autoscaling keys (checked by :func:`validate_cluster`); a cold start reads one replica's
    weights (every rank's) at ``cluster.cold_start_gb_s``."""
    c = cfg.cluster
    low, high = replica_bounds(cfg)
    memory = getattr(stack.executor, "memory", None)
    weights = memory.weight_bytes * cfg.tensor_parallel_size * cfg.get("pipeline_parallel_size", 1) if memory else 0.0
    return AutoscaleSettings(c.autoscale_interval_s, c.replicas, low, high, weights / (c.cold_start_gb_s * 1e9),
                             c.warm_pool, cfg.tensor_parallel_size * cfg.get("pipeline_parallel_size", 1))


def prefill_tokens_per_s(stack: Stack) -> float:
    """Prompt tokens per second of one replica prefilling full chunks of ``max_num_batched_tokens``
    (one prompt of that length, priced by its time model)."""
    if stack.time_model is None:
        return 0.0
    n = stack.limits.max_num_batched_tokens
    seconds = stack.time_model.predict(StepWork(num_tokens=n, num_seqs=1, prefill_tokens=n, num_sampled=1,
                                                attended=n * (n + 1) // 2, context_tokens=n))
    return n / seconds if seconds > 0 else 0.0


def migration_settings(cfg: DictConfig) -> MigrationSettings:
    """The ``cluster.migration_*``, ``draining`` and ``drain_from_s`` keys (checked by :func:`validate_cluster`)."""
    c = cfg.cluster
    return MigrationSettings(c.migration_interval_s, c.migration_precopy, c.migration_stop_blocks,
                             c.migration_max_stages, tuple(c.draining), c.drain_from_s)


def check_kv_compatible(prefill: DictConfig, decode: DictConfig) -> ModelShape:
    """One line naming both pools when a prompt's KV cannot move between them as it is stored."""
    def layout(pcfg):
        shape = model_shape(pcfg)
        dtype = getattr(pcfg.kv_cache_dtype, "value", pcfg.kv_cache_dtype)
        return shape, (shape.num_layers, shape.num_kv_heads, shape.head_dim, dtype, pcfg.block_size)

    (shape, a), (_, b) = layout(prefill), layout(decode)
    if a != b:
        def say(x):
            return f"layers={x[0]} kv_heads={x[1]} head_dim={x[2]} kv_cache_dtype={x[3]} block_size={x[4]}"
        raise ConfigError(f"cluster: the prefill replicas ({say(a)}) and the decode replicas ({say(b)}) store KV "
                          "differently, so a prompt's KV cannot move between them: give cluster.prefill and "
                          "cluster.decode the same kv_cache_dtype and block_size")
    return shape


def kv_bytes_per_token(cfg: DictConfig, shape: ModelShape) -> float:
    """One token's K and V over every layer and KV head (quantised values plus their scales)."""
    sizes = storage_bytes(cfg)
    return shape.kv_bytes_per_token(sizes.kv, 1, sizes.kv_scale)


def _stages(cfg: DictConfig) -> int:
    """Pipeline stages per replica: each stage's ranks move their own layers' KV, so a hand-off has this many
    times ``tensor_parallel_size`` lanes."""
    return cfg.get("pipeline_parallel_size", 1)


def _all_links(cfg: DictConfig, replicas: list[Replica], hardware: HardwareProfile):
    """The link between every two replicas of one pool (a migration's copies cross it)."""
    mode = getattr(cfg.cluster.kv_link, "value", cfg.cluster.kv_link)
    per_node = cfg.cluster.gpus_per_node
    return {(a.index, b.index): kv_link(hardware, hardware, a.gpu_offset // per_node == b.gpu_offset // per_node
                                        if mode == "auto" else mode == "intra_node",
                                        min(a.tensor_parallel_size, b.tensor_parallel_size) * _stages(cfg))
            for a in replicas for b in replicas if a is not b}


def _links(cfg: DictConfig, replicas: list[Replica], prefill_hw: HardwareProfile, decode_hw: HardwareProfile):
    mode = getattr(cfg.cluster.kv_link, "value", cfg.cluster.kv_link)
    per_node = cfg.cluster.gpus_per_node
    links = {}
    for p in (r for r in replicas if r.role == "prefill"):
        for d in (r for r in replicas if r.role == "decode"):
            same = p.gpu_offset // per_node == d.gpu_offset // per_node if mode == "auto" else mode == "intra_node"
            links[(p.index, d.index)] = kv_link(prefill_hw, decode_hw, same,
                                                min(p.tensor_parallel_size, d.tensor_parallel_size) * _stages(cfg))
    return links

