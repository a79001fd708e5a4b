"""``expert_cache=prefetch``: predict the next step's experts from recent routing and load them ahead.

Each expert's recent activation is an exponential moving average of the tokens routed to it per step
(``expert_cache.decay`` per step): the activation-aware prediction of MoE-Infinity (arXiv:2401.14361,
which prefetches and caches by activation statistics of recent requests). After each step the cache
wants the ``cache_slots`` experts with the highest score per rank and layer, whether or not they are
on the GPU now; one that is not is prefetched: the simulator issues its load when the previous MoE
layer's router runs in the next step (Pre-gated MoE's timing, arXiv:2308.12066), so it overlaps that
layer's experts and this layer's dense part instead of stalling at this layer's router.

``expert_cache.min_gain`` (hysteresis): a non-resident expert replaces a resident one only when its
score beats it by this factor, so noise at the boundary of the hot set does not move weights every step.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from servelab.plugin_api import ConfigError, ExpertCache, top_slots


@dataclass
class PrefetchConfig:
    decay: float = 0.9  # weight of the previous score per step (0: only the last step's routing)
    min_gain: float = 1.5  # a non-resident expert must score this many times a resident one to replace it


class PrefetchExpertCache(ExpertCache):
    """Keep (and prefetch) the experts with the highest recent activation."""

    name = "prefetch"
    Config = PrefetchConfig

    def __init__(self, config: PrefetchConfig, context) -> None:
        super().__init__(config, context)
        if not 0.0 <= config.decay < 1.0:
            raise ConfigError(f"expert_cache.decay={config.decay} must lie in [0, 1)")
        if config.min_gain < 1.0:
            raise ConfigError(f"expert_cache.min_gain={config.min_gain} must be >= 1")
        self._score = np.zeros(context.shape)

    def keep(self, resident, touched):
        d = self.config.decay
        self._score = d * self._score + (1 - d) * touched
        on_gpu = resident | (touched > 0)
        # what is on the GPU competes at its score, the rest at its score over min_gain
        return top_slots(np.where(on_gpu, self._score, self._score / self.config.min_gain),
                         self.context.cache_slots)
