"""How the built-in ``kv_connector`` plugins are built from ``(config, context)``: ``tiers`` (the
store below the GPU, :mod:`servelab.kv.tiers`) the prefill/decode hand-off (``pd_sim``,
``pd_local``, ``pd_process``: :mod:`servelab.kv.pd`) and live migration (``migrate_sim``:
:mod:`servelab.kv.migrate_sim`). The classes that select them by name are
``servelab.plugins.kv_connectors``'s; each names its function here.

A hand-off connector is chosen by the cluster (its :class:`~servelab.core.contexts.KVClusterLink`
carries the transport); selected anywhere else it is one line saying so.
"""

from __future__ import annotations

import time
from typing import Any

from servelab.core.contexts import KVConnectorContext
from servelab.core.errors import ConfigError
from servelab.core.kv_connector import KVConnector
from servelab.kv.migrate_sim import MigrationLinks
from servelab.kv.pd.sim import PDTransfers
from servelab.kv.tiers.shared import SharedTieredKVConnector
from servelab.kv.tiers.store import TieredKVConnector


def tiers(config: Any, context: KVConnectorContext) -> TieredKVConnector:
    """The tiered store over ``context.kv_tiers``, run by ``context.kv_tier_policy``; real bytes on an
    engine that computes tokens, a shared tier's books in a simulated cluster that has them."""
    specs, policy = context.kv_tiers, context.kv_tier_policy
    if not specs:
        raise ConfigError("kv_connector=tiers holds KV in tiers below the GPU and kv_tiers has none: add "
                          "kv_tiers=host (or host_disk)")
    if policy is None or not type(policy).stores:
        name = getattr(policy, "name", "none")
        raise ConfigError(f"kv_connector=tiers: kv_tier_policy={name} stores nothing below the GPU; choose one that "
                          "does, e.g. kv_tier_policy=write_back")
    shared = context.cluster.shared_tiers if context.cluster is not None else None
    if shared is not None and any(t.shared for t in specs):
        if context.computes_tokens:
            raise ConfigError("kv_tiers: a shared tier holds no real bytes (not built on an engine that computes "
                              "tokens); use shared=false or backend=sim")
        store: TieredKVConnector = SharedTieredKVConnector(specs, context.bytes_per_block, context.block_size, shared,
                                                             context.kv_tier_load)
    else:
        store = TieredKVConnector(specs, context.bytes_per_block, context.block_size, context.kv_tier_load)
        if context.computes_tokens:
            from servelab.kv.tiers.pools import tier_pools  # noqa: PLC0415 - torch, only for a real engine

            memory = context.host_memory
            store.attach_bytes(tier_pools(context.kv_pool, specs, context.kv_tier_disk_dir, context.at_close,
                                          memory.pool if memory is not None else None))
    store.bind(policy, context.block_events)
    if context.host_memory is not None:  # one host memory with the swap pool (servelab.kv.tiers.host_memory)
        store.share_host(context.host_memory, context.host_memory.tier)
    return store


def _link(context: KVConnectorContext, name: str, transport: type, where: str) -> Any:
    link = context.cluster
    if link is None or not isinstance(link.transport, transport) or link.role not in ("prefill", "decode"):
        raise ConfigError(f"kv_connector={name} hands a prompt's KV from a prefill replica to a decode replica "
                          f"{where}; the cluster chooses it (cluster.prefill_replicas=<n> cluster.decode_replicas=<n>), "
                          "it is not selected on its own")
    return link


def pd_sim(config: Any, context: KVConnectorContext) -> KVConnector:
    link = _link(context, "pd_sim", PDTransfers, "of a simulated cluster (backend=sim)")
    return link.transport.endpoint(link.index, link.role)


def migrate_sim(config: Any, context: KVConnectorContext) -> KVConnector:
    link = context.cluster
    if link is None or not isinstance(link.transport, MigrationLinks):
        raise ConfigError("kv_connector=migrate_sim moves a running request's KV between replicas of a simulated "
                          "cluster; the cluster chooses it (cluster.replicas=<n> with a migration_policy that moves "
                          "requests), it is not selected on its own")
    return link.transport.endpoint(link.index)


def pd_local(config: Any, context: KVConnectorContext) -> KVConnector:
    from servelab.kv.pd.local import LocalKVLink  # noqa: PLC0415 - torch

    link = _link(context, "pd_local", LocalKVLink, "of real engines in this process")
    return link.transport.endpoint(sends=link.role == "prefill", receives=link.role == "decode").bind_pool(
        context.kv_pool)


def pd_process(config: Any, context: KVConnectorContext) -> KVConnector:
    from servelab.kv.pd.process import ProcessKVConnector, ProcessLink  # noqa: PLC0415 - torch

    link = _link(context, "pd_process", ProcessLink, "between engine processes")
    clock = context.clock
    connector = ProcessKVConnector(link.role, send=link.transport.send, should_send=link.transport.should_send,
                                   on_loaded=link.transport.on_loaded,
                                   now=clock.now if clock is not None else time.perf_counter)
    return connector.bind_pool(context.kv_pool)
