"""``kv_tier_policy=write_back_prefetch``: write-back, and a queued request's prefix found below is
loaded while it waits (SGLang HiCache's prefetch, CachedAttention's scheduler-aware fetching).

Why: with load on hit a request's load happens at its admission, inside the step that admits it
(``kv_tiers.load=serialize``: the whole step waits; ``overlap``: what compute cannot hide). A
request that queues has time to spare: its blocks can cross the link meanwhile, so its admission
finds them loaded. The cost is bytes moved for requests that never read them (the GPU cache came
to hold the prefix first, or the block left its tier): ``kv_tier_prefetch_wasted_blocks``.
``max_staged`` bounds the blocks prefetched and not yet read (the staging room they take).
"""

from __future__ import annotations

from dataclasses import dataclass

from servelab.plugin_api import ConfigError, TierBlock

from .write_back import WriteBackPolicy


@dataclass
class WriteBackPrefetchConfig:
    max_staged: int = 1024  # blocks prefetched and not yet read by an admission, at most


class WriteBackPrefetchPolicy(WriteBackPolicy):
    """Write-back; prefetch every queued request's prefix below, up to ``max_staged`` blocks."""

    name = "write_back_prefetch"
    Config = WriteBackPrefetchConfig

    def __init__(self, config, context) -> None:
        super().__init__(config, context)
        if config.max_staged < 1:
            raise ConfigError(f"kv_tier_policy.max_staged={config.max_staged}: must be at least 1")

    def prefetch(self, tier: int, block: TierBlock, staged: int) -> bool:
        return staged < self.config.max_staged
