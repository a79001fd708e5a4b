"""``kv_tier_policy=reuse_aware``: write-back whose full tiers give up leaves before roots and
never-reused blocks before reused ones.

Why: a block is only ever hit after every block before it in its chain (a prompt matches a
prefix), so a tier that keeps a deep block but drops its parent holds bytes that can never be
read. LRU among a chat's blocks drops the oldest turn's *first* blocks first (they were stored
first) and so cuts every longer chain behind them. Here, among the ``window`` least recently used
blocks of a full tier, the victim is the one loaded least often, deepest first on ties; on the
last tier that is the block dropped. ``demote_min_loads``: a victim goes one tier down only if it
was loaded at least that often (0: always, like write-back), keeping one-off prompts off the disk.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from itertools import islice

from servelab.plugin_api import ConfigError, KVTierPolicy, TierBlock


@dataclass
class ReuseAwareConfig:
    window: int = 64  # how many of the least recently used blocks the victim is chosen among
    demote_min_loads: int = 0  # loads a victim needs to move one tier down rather than be dropped


class ReuseAwarePolicy(KVTierPolicy):
    """Write-back; victims: fewest loads, then deepest, among the LRU window."""

    name = "reuse_aware"
    Config = ReuseAwareConfig

    def __init__(self, config, context) -> None:
        super().__init__(config, context)
        if config.window < 1:
            raise ConfigError(f"kv_tier_policy.window={config.window}: must be at least 1")

    def victim(self, tier: int, blocks: "OrderedDict[bytes, TierBlock]") -> bytes:
        oldest = islice(blocks.values(), self.config.window)
        return min(oldest, key=lambda b: (b.loads, -b.position)).digest

    def demote(self, tier: int, block: TierBlock) -> int | None:
        if block.loads < self.config.demote_min_loads:
            return None
        return super().demote(tier, block)
