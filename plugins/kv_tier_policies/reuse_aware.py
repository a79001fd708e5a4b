"""``kv_tier_policy=reuse_aware``: write-back that stores only blocks whose depth has paid off, and
whose full tiers give up the blocks the GPU holds too, then deep blocks before shallow ones.

What to store (``min_reuse``): a block's chance of being read back is estimated by its depth in its
chain, learned online. Blocks are grouped by ``position // depth_bucket``; per group the policy
counts the stored blocks whose fate is known: loaded back by a request (at their first load), or
taken out of a tier never loaded (wasted). It stores an evicted block only while its group's
estimate ``(loaded + 1) / (loaded + wasted + 1)`` is at least ``min_reuse`` (every group starts at
1: stored; blocks still waiting in a tier count for nothing yet, so a tier's early fill does not
read as waste). A group below the bar still stores one block in ``explore`` so its estimate
can recover. Why depth: on multi-turn chat the blocks of a conversation's tail return only if the
conversation goes on, shared system prompts return often, and a tier full of never-read tails
pushes out blocks that would be read. ``min_reuse=0`` (the default) stores every evicted block,
exactly as ``write_back``.

Which block leaves: first a block the GPU holds too (the oldest such): a request loaded it and
the GPU prefix cache still has that copy, so dropping the tier's copy loses nothing now, and when
the GPU gives its copy up the block is offered to the tiers again (``store_on_evict``) as the most
recently used. Write-back keeps both copies and so spends the tier on duplicates. Failing that,
among the ``window`` least recently used blocks, the deepest in its chain: a block is only ever hit
after every block before it (a prompt matches a prefix), so LRU, which drops a conversation's
*first* blocks first (they were stored first), leaves the deeper blocks behind them unreadable.
On the kv_tiers study (full 1 GiB host tier, no disk) the two together compute fewer prefill tokens
than write_back's LRU (experiments/kv_tiers/README.md). ``demote_min_loads``: a victim goes one
tier down only if it was loaded at least that often (0: always, like write-back), keeping one-off
prompts off the disk.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from itertools import islice

from servelab.plugin_api import ConfigError, KVTierPolicy, TierBlock


@dataclass
class ReuseAwareConfig:
    window: int = 32  # how many of the least recently used blocks the deepest victim is chosen among
    demote_min_loads: int = 0  # loads a victim needs to move one tier down rather than be dropped
    min_reuse: float = 0.0  # store an evicted block only if its depth group's reuse estimate is at least this
    depth_bucket: int = 8  # blocks per depth group of the reuse estimate
    explore: int = 8  # a group below min_reuse still stores one evicted block in this many


class ReuseAwarePolicy(KVTierPolicy):
    """Write-back of the depths that get reused; victims: a block the GPU holds too, else the deepest
    of the LRU window."""

    name = "reuse_aware"
    Config = ReuseAwareConfig

    def __init__(self, config, context) -> None:
        super().__init__(config, context)
        for key, least in (("window", 1), ("depth_bucket", 1), ("explore", 1)):
            if getattr(config, key) < least:
                raise ConfigError(f"kv_tier_policy.{key}={getattr(config, key)}: must be at least {least}")
        if not 0.0 <= config.min_reuse <= 1.0:
            raise ConfigError(f"kv_tier_policy.min_reuse={config.min_reuse}: must be between 0 and 1")
        self.loaded: dict[int, int] = {}  # depth group -> stored blocks loaded at least once
        self.wasted: dict[int, int] = {}  # depth group -> stored blocks taken out of a tier never loaded
        self.skipped: dict[int, int] = {}  # depth group -> evicted blocks not stored since the last explored one
        # per tier: its blocks the GPU holds a copy of too (loaded, not yet given up by the GPU), oldest first
        self.on_gpu: list[dict[bytes, None]] = [{} for _ in self.tiers]

    def _group(self, block: TierBlock) -> int:
        return block.position // self.config.depth_bucket if block.position >= 0 else -1

    def reuse_estimate(self, block: TierBlock) -> float:
        """The estimated chance that a stored block at ``block``'s depth is loaded back."""
        group = self._group(block)
        loaded = self.loaded.get(group, 0)
        return (loaded + 1) / (loaded + self.wasted.get(group, 0) + 1)

    def store_on_evict(self, block: TierBlock) -> int | None:
        if not self.tiers:
            return None
        group = self._group(block)
        if self.config.min_reuse > 0 and self.reuse_estimate(block) < self.config.min_reuse:
            skipped = self.skipped[group] = self.skipped.get(group, 0) + 1
            if skipped < self.config.explore:
                return None
            self.skipped[group] = 0
        return 0

    def on_load(self, tier: int, block: TierBlock) -> None:
        on_gpu = self.on_gpu[tier]
        on_gpu.pop(block.digest, None)
        on_gpu[block.digest] = None  # the most recently loaded last
        if block.loads == 1:  # its first reuse
            group = self._group(block)
            self.loaded[group] = self.loaded.get(group, 0) + 1

    def on_gpu_evict(self, tier: int, block: TierBlock) -> None:
        self.on_gpu[tier].pop(block.digest, None)

    def victim(self, tier: int, blocks: "OrderedDict[bytes, TierBlock]") -> bytes:
        for digest in self.on_gpu[tier]:
            if digest in blocks:
                return digest
        oldest = islice(blocks.values(), self.config.window)
        return max(oldest, key=lambda b: b.position).digest

    def demote(self, tier: int, block: TierBlock) -> int | None:
        self.on_gpu[tier].pop(block.digest, None)  # it leaves this tier
        below = None if block.loads < self.config.demote_min_loads else super().demote(tier, block)
        if below is None and block.loads == 0:  # it leaves the tiers never read
            group = self._group(block)
            self.wasted[group] = self.wasted.get(group, 0) + 1
        return below
