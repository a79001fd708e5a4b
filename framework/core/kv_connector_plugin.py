"""The ``kv_connector`` plugin kind's base: a :class:`~servelab.core.kv_connector.KVConnector` built
as ``cls(config, context)`` with a :class:`~servelab.core.contexts.KVConnectorContext`.

``kv_connector=<name>`` selects one (``kv_connector.<field>=...`` sets its ``Config``); ``none``
(the default) is no connector at all. The stack composes what a run needs, in this order: the
cluster's prefill/decode hand-off (``pd_sim``, ``pd_local``, ``pd_process``, chosen by the cluster),
the tiers below the GPU when ``kv_tiers`` configures any (``tiers``: ``kv_tiers=host`` is its
shorthand), then the selected connector (``multi`` lists several); one is used as it is, several
through ``multi`` (loads: the first connector that matches a request's tokens serves them; saves
and worker-side calls: every connector). The connector interface itself, its call order and its
contracts are :mod:`servelab.core.kv_connector`'s.
"""

from __future__ import annotations

from typing import Any, ClassVar

from servelab.core.contexts import EngineClock, KVConnectorContext
from servelab.core.interfaces import Plugin
from servelab.core.kv_connector import KVConnector


class KVConnectorPlugin(Plugin, KVConnector):
    """Base class of ``kv_connector`` plugins: the :class:`KVConnector` methods (every default does
    nothing) plus the plugin's ``name``, ``Config`` and ``context``. Useful context fields are also
    attributes: ``self.kv_pool``, ``self.clock``, ``self.block_size``."""

    name: ClassVar[str] = "none"
    context_type = KVConnectorContext

    context: KVConnectorContext

    def __init__(self, config: Any, context: KVConnectorContext | None = None) -> None:
        super().__init__(config, context if context is not None else KVConnectorContext())

    @property
    def kv_pool(self) -> Any:
        return self.context.kv_pool

    @property
    def clock(self) -> EngineClock | None:
        return self.context.clock

    @property
    def block_size(self) -> int:
        return int(self.context.block_size)
