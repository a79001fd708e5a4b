"""The cluster's plugins, built through the kinds table like every plugin: once per cluster, by each of
the protocol's drivers (:mod:`servelab.cluster.protocol`): the router, the migration policy, the autoscaler."""

from __future__ import annotations

from typing import Sequence

from omegaconf import DictConfig

from servelab.assemble.executor import plugin_config
from servelab.core.errors import ConfigError
from servelab.core.interfaces import ReplicaView, Router
from servelab.core.kinds import KINDS, build_context, instantiate
from servelab.core.autoscaler import Autoscaler
from servelab.core.migration_policy import MigrationPolicy
from servelab.core.registry import Registry, default_registry


def build_router(cfg: DictConfig, views: Sequence[ReplicaView], registry: Registry | None = None) -> Router:
    """The plugin ``router=<name>`` selects (from ``registry``; default the installed plugins), built
    for the replicas as ``views`` show them at the start and the run's seed. A constructor refusing
    its config is one line naming the option."""
    spec = KINDS["router"]
    name = cfg[spec.group].name
    cls = (registry or default_registry()).get(spec.name, name)
    context = build_context(spec, {"replicas": tuple(views), "seed": cfg.seed})
    try:
        return instantiate(spec, cls, plugin_config(cfg[spec.group]), context)
    except ValueError as exc:
        raise ConfigError(f"{spec.group}={name}: {exc}") from None


def build_migration_policy(cfg: DictConfig, num_replicas: int, registry: Registry | None = None) -> MigrationPolicy:
    """The plugin ``migration_policy=<name>`` selects, for ``num_replicas`` replicas asked every
    ``cluster.migration_interval_s``; a constructor refusing its config is one line naming the option."""
    spec = KINDS["migration_policy"]
    node = cfg.get(spec.group)
    name = node.name if node is not None else spec.default
    cls = (registry or default_registry()).get(spec.name, name)
    context = build_context(spec, {"num_replicas": num_replicas, "interval_s": cfg.cluster.migration_interval_s,
                                   "seed": cfg.seed})
    config = plugin_config(node) if node is not None else cls.Config()
    try:
        return instantiate(spec, cls, config, context)
    except ValueError as exc:
        raise ConfigError(f"{spec.group}={name}: {exc}") from None


def autoscaler_class(cfg: DictConfig, registry: Registry | None = None) -> type[Autoscaler]:
    """The class ``autoscaler=<name>`` selects (default ``none``)."""
    spec = KINDS["autoscaler"]
    node = cfg.get(spec.group)
    return (registry or default_registry()).get(spec.name, node.name if node is not None else spec.default)


def build_autoscaler(cfg: DictConfig, values: dict, registry: Registry | None = None) -> Autoscaler:
    """The plugin ``autoscaler=<name>`` selects, built for ``values`` (its context's fields: the bounds,
    the interval, a cold start's seconds, a replica's prefill rate); a constructor refusing its config is
    one line naming the option."""
    spec = KINDS["autoscaler"]
    node = cfg.get(spec.group)
    cls = autoscaler_class(cfg, registry)
    context = build_context(spec, {**values, "seed": cfg.seed})
    config = plugin_config(node) if node is not None else cls.Config()
    try:
        return instantiate(spec, cls, config, context)
    except ValueError as exc:
        raise ConfigError(f"{spec.group}={cls.name}: {exc}") from None
