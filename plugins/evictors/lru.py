"""``evictor=lru``: give up the cached block that became evictable longest ago (the default).

This is the paged allocator's historical behaviour, kept to the block: a block joins the back of
the queue when its last reference goes away, leaves it when a request reuses it, and eviction
takes the front. (The allocator releases a finished request's blocks tail first, so a prefix's
deeper blocks leave before the shared blocks they extend.)
"""

from __future__ import annotations

from collections import OrderedDict

from servelab.plugin_api import Evictor


class LruEvictor(Evictor):
    """Least recently released first."""

    name = "lru"

    def __init__(self, config, context) -> None:
        super().__init__(config, context)
        self.queue: OrderedDict[int, None] = OrderedDict()  # oldest first

    def on_hit(self, block: int) -> None:
        self.queue.pop(block, None)

    def on_release(self, block: int) -> None:
        self.queue[block] = None

    def evict(self) -> int | None:
        if not self.queue:
            return None
        block, _ = self.queue.popitem(last=False)
        return block
