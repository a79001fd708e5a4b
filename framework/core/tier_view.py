"""What a KV tier policy may read while the run goes: the tiers' occupancy and the GPU prefix cache's
reuse of a block (``self.context.tier_view``; :class:`~servelab.core.kv_tiers.KVTierPolicy`).

Live and read-only: each call answers for this moment of the run. The base class is the view of a run
without a tiered store (``kv_tier_policy=none``: no tier holds anything, no hit is counted); the store's
view (:mod:`servelab.kv.tiers.view`) reads the store's books and counts the allocator's prefix-cache hits.
No torch: a policy package imports it through ``servelab.plugin_api``.
"""

from __future__ import annotations


class TierView:
    """Occupancy of the tiers below the GPU and the GPU prefix cache's reuse counts, as of now."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

    def held(self, tier: int) -> int:
        """Blocks tier ``tier`` holds now (at most its ``TierSpec.num_blocks``)."""
        return 0

    def tier_of(self, digest: bytes) -> int | None:
        """The tier holding the block of prefix digest ``digest`` now, or None."""
        return None

    def gpu_hits(self, digest: bytes) -> int:
        """How many admissions so far reused the block ``digest`` from the GPU prefix cache (its GPU-side
        reuse; loads from a tier are ``TierBlock.loads``). Counted from the run's start, kept after the GPU
        gives the block up."""
        return 0

    def on_gpu(self, digest: bytes) -> bool:
        """Whether the GPU prefix cache holds the block ``digest`` now (a tier's copy is then a second one)."""
        return False
