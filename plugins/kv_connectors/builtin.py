"""``kv_connector=none``, ``tiers``, the prefill/decode hand-off (``pd_sim``, ``pd_local``,
``pd_process``) and live migration (``migrate_sim``).

Each but ``none`` is built by a function of :mod:`servelab.kv.builtins` from ``(config, context)``:
they hold real bytes (torch) or a cluster's books, which live in ``servelab.kv``; registering them
here, by name, imports none of that until a run builds one (as the torch executors are registered).
"""

from __future__ import annotations

import importlib
from typing import ClassVar

from servelab.plugin_api import KVConnectorContext, KVConnectorPlugin


class NoConnector(KVConnectorPlugin):
    """``kv_connector=none`` (the default): no KV enters or leaves the engine (the stack builds no
    connector at all: today's engine, exactly), unless ``kv_tiers`` or a cluster adds one."""

    name = "none"


class _Built(KVConnectorPlugin):
    """Built by ``target`` (``"module:function"`` of ``(config, context)``), which returns the connector."""

    target: ClassVar[str]

    def __new__(cls, config, context: KVConnectorContext):  # type: ignore[misc]
        module, _, function = cls.target.partition(":")
        return getattr(importlib.import_module(module), function)(config, context)


class TiersConnector(_Built):
    """``kv_connector=tiers``: the host / disk tiers below the GPU that ``kv_tiers`` configures, run by
    ``kv_tier_policy`` (``kv_tiers=host`` alone selects it)."""

    name = "tiers"
    target = "servelab.kv.builtins:tiers"


class PDSimConnector(_Built):
    """``kv_connector=pd_sim``: a simulated cluster's prefill->decode hand-off, priced over its links
    (a cluster with ``cluster.prefill_replicas`` on ``backend=sim`` chooses it)."""

    name = "pd_sim"
    target = "servelab.kv.builtins:pd_sim"


class MigrateSimConnector(_Built):
    """``kv_connector=migrate_sim``: a simulated cluster's live migration of running requests, priced
    over its links (a cluster with ``cluster.replicas=N`` and a ``migration_policy`` that moves
    requests chooses it)."""

    name = "migrate_sim"
    target = "servelab.kv.builtins:migrate_sim"


class PDLocalConnector(_Built):
    """``kv_connector=pd_local``: block contents copied between real engines of one process."""

    name = "pd_local"
    target = "servelab.kv.builtins:pd_local"


class PDProcessConnector(_Built):
    """``kv_connector=pd_process``: a prompt's KV sent between engine processes (a real cluster with
    ``cluster.prefill_replicas`` chooses it)."""

    name = "pd_process"
    target = "servelab.kv.builtins:pd_process"
