"""``expert_cache=lru``: keep the experts used most recently. After each step the cache holds, of
what is on the GPU (the resident experts and those the step streamed in), the ``cache_slots`` last
touched per rank and layer; ties (touched in the same step) go to the one with more tokens, then the
lower slot. The policy of Eliseev and Mazur's Mixtral offloading (arXiv:2312.17238, an LRU cache of
experts per layer) and of LLMServingSim 2.0's expert-offloading baseline. Loads only on demand."""

from __future__ import annotations

import numpy as np

from servelab.plugin_api import ExpertCache, top_slots


class LruExpertCache(ExpertCache):
    """Least recently used out first."""

    name = "lru"

    def __init__(self, config, context) -> None:
        super().__init__(config, context)
        self._last = np.full(context.shape, -1, dtype=np.int64)  # the step each slot was last touched
        self._step = 0

    def keep(self, resident, touched):
        used = touched > 0
        self._last[used] = self._step
        self._step += 1
        # recency first, this step's tokens second: one sortable score
        score = self._last * (int(touched.max(initial=0)) + 1) + touched
        return top_slots(score, self.context.cache_slots, allowed=resident | used)
