"""The router plugin of a cluster, built through the kinds table like every plugin: once per cluster,
by each of the protocol's drivers (:mod:`servelab.cluster.protocol`)."""

from __future__ import annotations

from typing import Sequence

from omegaconf import DictConfig

from servelab.assemble.executor import plugin_config
from servelab.core.errors import ConfigError
from servelab.core.interfaces import ReplicaView, Router
from servelab.core.kinds import KINDS, build_context, instantiate
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
