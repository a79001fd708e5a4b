"""An engine's KV connector, assembled from the ``kv_connector`` kind's table.

:func:`connector_names` says which connectors a run needs, in the order a load asks them: the
cluster's prefill/decode hand-off (its :class:`~servelab.core.contexts.KVClusterLink` names the
built-in), ``tiers`` when ``kv_tiers`` configures tiers and ``kv_tier_policy`` stores (the
shorthand; not again when the selection lists it), then the one ``kv_connector=`` selects
(``multi`` builds the parts it lists). No name: no connector (None: today's engine, exactly,
fast-forward included); one: that connector; several: ``multi`` over them. :func:`parts` lists
what a composed connector is made of.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable, Iterator, TypeVar

from omegaconf import DictConfig, OmegaConf

from servelab.core.contexts import KVClusterLink, KVConnectorContext
from servelab.core.errors import ConfigError
from servelab.core.kinds import KINDS, instantiate
from servelab.core.kv_connector import KVConnector
from servelab.core.registry import Registry

T = TypeVar("T")


def connector_names(cfg: DictConfig, tiers: bool, cluster: KVClusterLink | None) -> list[str]:
    """The connectors this engine needs, in load order (``tiers``: the tiers shorthand applies);
    ``multi`` stands for the parts ``kv_connector.connectors`` lists."""
    names = [cluster.hand_off] if cluster is not None and cluster.hand_off else []
    node = cfg.get("kv_connector")
    chosen = node.name if node is not None else "none"
    listed = list(node.connectors) if chosen == "multi" else [chosen]
    if tiers and "tiers" not in listed:
        names.append("tiers")
    if chosen != "none" and chosen not in names:
        names.append(chosen)
    return names


def build_kv_connector(cfg: DictConfig, registry: Registry, context: KVConnectorContext, tiers: bool,
                       given: KVConnector | None = None) -> KVConnector | None:
    """The engine's connector (None: none); ``given``: one the caller built, asked first."""
    spec = KINDS["kv_connector"]
    node = cfg.get("kv_connector")
    chosen = node.name if node is not None else "none"

    def build(name: str) -> KVConnector:
        cls = registry.get("kv_connector", name)
        config = plugin_config(node) if name == chosen else cls.Config()
        return _instantiated(spec, cls, config, context_for, f"kv_connector={name}")

    context_for = _with_build(context, build)
    names = connector_names(cfg, tiers, context.cluster)
    built = ([given] if given is not None else []) + [build(n) for n in names]
    if not built:
        return None
    if len(built) == 1:
        return built[0]
    multi = registry.get("kv_connector", "multi")
    return multi(multi.Config(connectors=[getattr(c, "name", type(c).__name__) for c in built]), context_for,
                 connectors=built)


def _with_build(context: KVConnectorContext, build: Callable[[str], KVConnector]) -> KVConnectorContext:
    return replace(context, build=build)


def _instantiated(spec, cls, config, context, where: str) -> KVConnector:
    try:
        return instantiate(spec, cls, config, context)
    except ValueError as exc:  # ConfigError too: one line naming the option
        raise ConfigError(str(exc) if str(exc).startswith(("kv_connector", "kv_tier", "cluster.")) else
                          f"{where}: {exc}") from None


def plugin_config(node: DictConfig) -> Any:
    """The selected connector's typed ``Config`` (with ``name``)."""
    return OmegaConf.to_object(node)


def parts(connector: Any) -> Iterator[Any]:
    """The connectors ``connector`` is made of, depth first (``connector`` itself when it composes
    nothing; nothing for None). Anything holding a list ``connectors`` (``multi``, a checking
    wrapper) counts as composed."""
    if connector is None:
        return
    inner = getattr(connector, "connectors", None)
    if isinstance(inner, list):
        for part in inner:
            yield from parts(part)
    else:
        yield connector


def find_part(connector: Any, cls: type[T]) -> T | None:
    """The first part of ``connector`` that is a ``cls`` (None: none is)."""
    return next((p for p in parts(connector) if isinstance(p, cls)), None)
