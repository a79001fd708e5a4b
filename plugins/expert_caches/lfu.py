"""``expert_cache=lfu``: keep the experts used most often. Every token routed to an expert counts for
it over the whole run; after each step the cache holds, of what is on the GPU (the resident experts and
those the step streamed in), the ``cache_slots`` with the most tokens per rank and layer (ties: the
lower slot). MoE-Infinity (arXiv:2401.14361) replaces LRU with activation-frequency priorities for the
same reason it shows here: under skewed routing the hot experts are hot for the whole run. Loads only on
demand."""

from __future__ import annotations

import numpy as np

from servelab.plugin_api import ExpertCache, top_slots


class LfuExpertCache(ExpertCache):
    """Least frequently used out first."""

    name = "lfu"

    def __init__(self, config, context) -> None:
        super().__init__(config, context)
        self._tokens = np.zeros(context.shape, dtype=np.int64)

    def keep(self, resident, touched):
        self._tokens += touched
        return top_slots(self._tokens, self.context.cache_slots, allowed=resident | (touched > 0))
