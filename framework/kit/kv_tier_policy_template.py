"""The ``servelab new-plugin kv_tier_policy <name>`` skeleton (named by the kinds table)."""

from __future__ import annotations

from string import Template

from servelab.kit.plugin_templates import _HEAD

TEMPLATE = Template(_HEAD + '''\
from servelab.plugin_api import KVTierPolicy


@dataclass
class ${Class}Config:
    min_position: int = 0  # spill only blocks at least this deep in their chain (0: every block)
    max_staged: int = 0  # prefetch for queued requests while fewer blocks are staged (0: load on hit only)


class $Class(KVTierPolicy):
    """Write-back that keeps a chain's first ``min_position`` blocks off the tiers (they are shared
    system prompts the GPU keeps anyway) and, when a tier is full, gives up its most recently stored
    block instead of the least recently used one. Change the methods to make it your policy; run
    with ``backend=sim kv_tiers=host_disk kv_tier_policy=$name``."""

    name = "$name"
    Config = ${Class}Config

    def store_on_evict(self, block):
        if 0 <= block.position < self.config.min_position:
            return None  # not stored: lost with the GPU copy
        return 0  # the nearest tier (host)

    def victim(self, tier, blocks):
        return next(reversed(blocks))  # blocks: least recently used first

    def demote(self, tier, block):
        return tier + 1 if tier + 1 < len(self.tiers) else None

    def prefetch(self, tier, block, staged):
        return staged < self.config.max_staged  # True: load it now, while its request queues


@hookimpl
def servelab_register_kv_tier_policies():
    return [$Class]
''')
