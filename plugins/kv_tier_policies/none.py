"""``kv_tier_policy=none``: nothing goes below the GPU (the default; today's engine, exactly).

With this policy the run builds no tiered store and no KV connector, whatever ``kv_tiers`` says:
its results equal a run without the key, byte for byte (tests/test_kv_tiers.py).
"""

from __future__ import annotations

from servelab.plugin_api import KVTierPolicy, TierBlock


class NoTierPolicy(KVTierPolicy):
    """Stores nothing."""

    name = "none"
    stores = False

    def store_on_evict(self, block: TierBlock) -> int | None:
        return None
