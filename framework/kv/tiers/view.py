"""The live :class:`~servelab.core.tier_view.TierView` of a tiered store: a KV tier policy's
``context.tier_view``. It reads the store's books (which tier holds a block, how full each is) and counts
the GPU prefix cache's hits per block digest from the allocator's block events (``on_block_hit``), so the
store's own code is not involved."""

from __future__ import annotations

from typing import Any

from servelab.core.interfaces import BlockEventSubscriber
from servelab.core.tier_view import TierView
from servelab.kv.tiers.store import TieredKVConnector


class StoreView(TierView, BlockEventSubscriber):
    """``store``'s occupancy, and the hits of the allocator it is :meth:`attach` ed to."""

    def __init__(self, store: TieredKVConnector | None) -> None:
        self.store: Any = store  # set by the stack once the kv_connector kind built it (None until then)
        self.allocator: Any = None
        self.hits: dict[bytes, int] = {}
        self.on_gpu_now: set[bytes] = set()  # digests in the GPU prefix cache (stored, not yet evicted)

    def attach(self, allocator: Any) -> "StoreView":
        """Count ``allocator``'s prefix-cache hits (its block events; an allocator that publishes none,
        prefix caching off, has no hits to count)."""
        self.allocator = allocator
        if allocator.publishes_block_events:
            allocator.subscribe(self)
        return self

    def on_block_stored(self, digest: bytes, block: int) -> None:
        self.on_gpu_now.add(digest)

    def on_block_hit(self, digest: bytes, block: int) -> None:
        self.hits[digest] = self.hits.get(digest, 0) + 1

    def on_block_evicted(self, digest: bytes, block: int) -> None:
        self.on_gpu_now.discard(digest)

    def held(self, tier: int) -> int:
        return len(self.store.blocks[tier])

    def tier_of(self, digest: bytes) -> int | None:
        return self.store.where.get(digest)

    def gpu_hits(self, digest: bytes) -> int:
        return self.hits.get(digest, 0)

    def on_gpu(self, digest: bytes) -> bool:
        return digest in self.on_gpu_now
