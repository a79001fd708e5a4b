"""The live :class:`~servelab.core.tier_view.TierView` of a tiered store: a KV tier policy's
``context.tier_view``. It reads the store's books (which tier holds a block, how full each is) and counts
the GPU prefix cache's hits per block digest from the paged allocator's ``hit_listeners``, so the store's
own code is not involved."""

from __future__ import annotations

from typing import Any

from servelab.core.tier_view import TierView
from servelab.kv.tiers.store import TieredKVConnector


class StoreView(TierView):
    """``store``'s occupancy, and the hits of the allocator it is :meth:`attach` ed to."""

    def __init__(self, store: TieredKVConnector | None) -> None:
        self.store: Any = store  # set by the stack once the kv_connector kind built it (None until then)
        self.allocator: Any = None
        self.hits: dict[bytes, int] = {}

    def attach(self, allocator: Any) -> "StoreView":
        """Count ``allocator``'s prefix-cache hits (a paged allocator: ``hit_listeners``, ``cached``)."""
        self.allocator = allocator
        allocator.hit_listeners.append(self._on_hits)
        return self

    def _on_hits(self, digests: list[bytes]) -> None:
        hits = self.hits
        for digest in digests:
            hits[digest] = hits.get(digest, 0) + 1

    def held(self, tier: int) -> int:
        return len(self.store.blocks[tier])

    def tier_of(self, digest: bytes) -> int | None:
        return self.store.where.get(digest)

    def gpu_hits(self, digest: bytes) -> int:
        return self.hits.get(digest, 0)

    def on_gpu(self, digest: bytes) -> bool:
        return self.allocator is not None and digest in self.allocator.cached
