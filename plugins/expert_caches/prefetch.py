"""``expert_cache=prefetch``: LFU residency plus speculative loading of each layer's experts one MoE
layer ahead.

Which experts stay resident is :mod:`lfu`'s choice. On top, the cache guesses the experts the next MoE
layer's tokens will be routed to while the current layer runs and loads the ones not resident ahead:
Eliseev and Mazur's speculative expert loading for Mixtral offloading (arXiv:2312.17238: the next
layer's gate applied to the current layer's hidden state), the pre-gate of Pre-gated MoE (arXiv:2308.12066,
a gate trained to pick the next block's experts, exact by construction) and MoE-Infinity's prefetching
(arXiv:2401.14361). The simulator has no hidden states, so the guess is modelled by its recall
(``expert_cache.recall``, the share of guesses that are right, default 0.8: an assumption in the range
those papers describe, not a measurement): a layer with ``m`` misses has ``m`` loads issued at the
previous layer's router, each right with probability ``recall``; the wrong guesses still took the link,
and the misses they left are loaded on demand after them (:mod:`servelab.sim.moe_cache`). The first MoE
layer of a step has nothing earlier to guess from: its misses load on demand.
"""

from __future__ import annotations

from dataclasses import dataclass

from servelab.plugin_api import ConfigError

from .lfu import LfuExpertCache


@dataclass
class PrefetchConfig:
    recall: float = 0.8  # the share of a layer's guessed experts that are right (1: Pre-gated MoE's exact pre-gate)


class PrefetchExpertCache(LfuExpertCache):
    """LFU residency, and each layer's misses guessed and loaded one layer early."""

    name = "prefetch"
    Config = PrefetchConfig

    def __init__(self, config: PrefetchConfig, context) -> None:
        super().__init__(config, context)
        if not 0.0 <= config.recall <= 1.0:
            raise ConfigError(f"expert_cache.recall={config.recall} must lie in [0, 1]")
        self.lookahead_recall = float(config.recall)
