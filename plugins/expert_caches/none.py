"""``expert_cache=none`` (the default): every expert resident on the GPU, nothing offloaded; the
simulator prices no cache (every result as before expert offloading existed)."""

from __future__ import annotations

import numpy as np

from servelab.plugin_api import ExpertCache


class NoExpertCache(ExpertCache):
    """All experts resident."""

    name = "none"
    all_resident = True

    def start(self):
        return np.ones(self.context.shape, dtype=bool)

    def keep(self, resident, touched):
        return np.ones(self.context.shape, dtype=bool)
