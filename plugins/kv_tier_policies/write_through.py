"""``kv_tier_policy=write_through``: copy every full block of a finished request to the nearest
tier at once (LMCache's store-on-finish), so a block the GPU later evicts is already below.

More bytes cross the host link than with write-back (blocks the GPU keeps are written too), but
an eviction costs nothing and a GPU pool that is evicting hard never loses a block it did not
write in time. A block a tier holds already is not written again.
"""

from __future__ import annotations

from servelab.plugin_api import KVTierPolicy, TierBlock


class WriteThroughPolicy(KVTierPolicy):
    """Store on finish into tier 0; evictions need no write (the copy is there)."""

    name = "write_through"

    def store_on_finish(self, block: TierBlock) -> int | None:
        return 0 if self.tiers else None
