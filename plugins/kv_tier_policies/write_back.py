"""``kv_tier_policy=write_back``: spill what the GPU prefix cache evicts (vLLM's CPU offloading,
SGLang HiCache's write-back).

A block goes to the nearest tier only when the GPU evictor gives it up, so nothing is written
while the GPU pool holds the working set. A full tier's least recently used block moves one tier
down (host -> disk); the last tier drops it.
"""

from __future__ import annotations

from servelab.plugin_api import KVTierPolicy


class WriteBackPolicy(KVTierPolicy):
    """Spill on GPU eviction, LRU victims, demote one tier down (the base class's defaults)."""

    name = "write_back"
