"""Expert offloading as the simulator runs it: an ``expert_cache`` plugin (:mod:`servelab.core.expert_cache`)
decides which experts of each rank's share stay on the GPU, the rest cross the host link when routed to.

Each rank has its own host link (``hardware.host_link_gb_s``, PCIe per direction: one x16 link per GPU
as on HGX/DGX nodes), one copy stream on it served in issue order, and no latency term (an expert is
megabytes: the bandwidth term dominates). An expert load moves one rank's shard of it: gate, up and down
of ``moe_intermediate_size / (tp / ep)`` columns (the bytes a placement's move carries). A step walks
the MoE layers in order on one clock shared by the ranks (the all-to-all, or the all-reduce, syncs them
every layer):

1. the layer's dense part runs (norms, attention projections, router, shared experts: the time model's
   dense part of a MoE layer; the attention kernel itself is not counted here, so the window a prefetch
   hides behind is, if anything, too short);
2. at its router, each rank issues its **misses** (routed experts not resident) on its link; the layer's
   experts start when every rank's misses and its touched **prefetches** have arrived; the wait beyond
   the router is the layer's **stall**, added to the step;
3. also at the router, the prefetches the cache chose for the *next* MoE layer are issued (after the
   misses), then, for a cache with a ``lookahead_recall``, its guesses of the next layer's misses (as many
   loads as that layer has misses, each right with that probability; the wrong ones leave misses loaded on
   demand at that layer's router): they load while this layer's experts and the next layer's dense part
   run (Pre-gated MoE, arXiv:2308.12066; the first MoE layer's prefetches are issued at the step's start,
   its misses are never guessed);
4. the layer's experts run (their price unchanged: a loaded expert is read from HBM like a resident one).

Figures: hits and misses (routed expert slots per rank and layer, each step), prefetches, the bytes
loaded, the stall seconds. The policy sees the step's touched slots after the step (``keep``).
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from servelab.core.errors import ConfigError
from servelab.core.expert_cache import ExpertCache, ExpertCacheContext, check_mask
from servelab.core.shapes import HardwareProfile


class CachedExperts:
    """One run's expert cache: :meth:`step` prices a step's loads and stalls and asks the plugin for the
    next resident set."""

    def __init__(self, cache: ExpertCache, context: ExpertCacheContext, hardware: HardwareProfile,
                 expert_bytes: float, dense_fn: Callable[[int], float] | None) -> None:
        """``expert_bytes``: one rank's shard of one expert; ``dense_fn(n)``: seconds of one MoE layer's
        dense part at ``n`` tokens (None: no dense window, the prefetch hides behind experts only)."""
        self.cache, self.context = cache, context
        self.name = getattr(cache, "name", type(cache).__name__)
        self._who = f"expert_cache={self.name}"
        self.expert_bytes = expert_bytes
        self._load_s = expert_bytes / (hardware.host_link_gb_s * 1e9)
        self.link = f"{hardware.name}'s host link {hardware.host_link_gb_s:g} GB/s"
        self._dense_fn = dense_fn
        self._dense: dict[int, float] = {}
        self.resident = check_mask(cache.start(), context, self._who + " start()")
        self._prefetch = np.zeros(context.shape, dtype=bool)  # slots loaded ahead in the coming step
        self._recall = float(getattr(cache, "lookahead_recall", 0.0) or 0.0)
        if not 0.0 <= self._recall <= 1.0:
            raise ConfigError(f"{self._who}: lookahead_recall={self._recall} must lie in [0, 1]")
        self._rng = np.random.default_rng([context.seed, 5])  # which guesses are right (deterministic)
        self.guessed = self.guessed_right = 0
        self.hits = self.misses = self.prefetches = self.prefetch_hits = 0
        self.stall_s = 0.0
        self.steps = 0

    def _dense_s(self, n: int) -> float:
        if self._dense_fn is None:
            return 0.0
        if n not in self._dense:
            self._dense[n] = float(np.asarray(self._dense_fn(n)).reshape(-1)[0])
        return self._dense[n]

    def step(self, n: int, per_slot: np.ndarray, expert_s: np.ndarray) -> float:
        """The stall seconds of a step of ``n`` tokens: ``per_slot`` its tokens per slot ``[layers, ep,
        slots]``, ``expert_s`` each MoE layer's expert seconds (the slowest rank's); then the plugin's
        next resident set."""
        touched = per_slot > 0
        miss = touched & ~self.resident
        pre_used = touched & self._prefetch
        miss_n = miss.sum(axis=2)  # [layers, ep]
        pre_n = self._prefetch.sum(axis=2)
        guessed = np.zeros_like(miss_n)  # misses loaded one layer early (lookahead), right guesses among them
        right = np.zeros_like(miss_n)
        if self._recall > 0 and miss_n.shape[0] > 1:
            guessed[1:] = miss_n[1:]
            right[1:] = self._rng.binomial(miss_n[1:], self._recall)
        dense = self._dense_s(n)
        load = self._load_s
        layers, ep = miss_n.shape
        free = np.zeros(ep)  # when each rank's link is next idle
        t = stall = 0.0
        arrived = pre_n[0] * load if layers else free  # layer 0's prefetches, issued at the step's start
        early = np.zeros(ep)  # when the current layer's guessed loads arrived
        free = np.maximum(free, arrived)
        for layer in range(layers):
            t += dense
            m = miss_n[layer] - right[layer]  # loaded on demand now
            if m.any():
                free = np.where(m > 0, np.maximum(free, t) + m * load, free)
            ready = max(float(np.where(m > 0, free, 0.0).max()),
                        float(np.where(pre_used[layer].any(axis=1), arrived, 0.0).max()),
                        float(np.where(right[layer] > 0, early, 0.0).max()))
            if layer + 1 < layers:  # the next layer's prefetches, then its guesses, after this layer's misses
                p, g = pre_n[layer + 1], guessed[layer + 1]
                if p.any():
                    free = np.where(p > 0, np.maximum(free, t) + p * load, free)
                arrived = np.where(p > 0, free, 0.0)
                if g.any():
                    free = np.where(g > 0, np.maximum(free, t) + g * load, free)
                early = np.where(g > 0, free, 0.0)
            if ready > t:
                stall += ready - t
                t = ready
            t += float(expert_s[layer])
        self.steps += 1
        self.hits += int((touched & self.resident).sum())
        self.misses += int(miss.sum())
        self.prefetch_hits += int(pre_used.sum())
        self.guessed += int(guessed.sum())
        self.guessed_right += int(right.sum())
        self.stall_s += stall
        nxt = check_mask(self.cache.keep(self.resident.copy(), per_slot.copy()), self.context, self._who)
        self._prefetch = nxt & ~(self.resident | touched)
        self.prefetches += int(self._prefetch.sum())
        self.resident = nxt
        return stall

    @property
    def loads(self) -> int:
        """Expert shards that crossed the link: misses, prefetches, and the wrong guesses beside the right."""
        return self.misses + self.prefetches + self.guessed - self.guessed_right

    @property
    def offloaded_bytes(self) -> float:
        """One rank's expert weights in host memory (the memory plan gave them to the KV pool)."""
        c = self.context
        return (c.experts_per_rank - c.cache_slots) * c.num_moe_layers * self.expert_bytes

    def label(self) -> str:
        c = self.context
        return (f"expert_cache={self.name}: {c.cache_slots} of {c.experts_per_rank} experts per rank and MoE layer "
                f"on the GPU, the rest in host memory ({self.offloaded_bytes / 1e9:.1f} GB per rank, added to the KV "
                f"pool; {self.expert_bytes / 1e6:.1f} MB a shard) loaded over {self.link}")

    def summary(self) -> dict:
        routed = self.hits + self.misses
        return {"moe_expert_cache": self.name, "moe_expert_cache_slots": self.context.cache_slots,
                "moe_expert_cache_offloaded_bytes_per_rank": self.offloaded_bytes,
                "moe_expert_cache_hits": self.hits, "moe_expert_cache_misses": self.misses,
                "moe_expert_cache_hit_rate": self.hits / routed if routed else 0.0,
                "moe_expert_cache_prefetches": self.prefetches,
                "moe_expert_cache_prefetch_hits": self.prefetch_hits,
                "moe_expert_cache_lookahead_loads": self.guessed, "moe_expert_cache_lookahead_right": self.guessed_right,
                "moe_expert_cache_bytes_loaded": self.loads * self.expert_bytes,
                "moe_expert_cache_stall_s": self.stall_s}


def offload_check(cache: ExpertCache, placement) -> None:
    """A re-planning placement moves experts between ranks while the cache holds them: refused in one line."""
    every = int(getattr(placement, "replan_every_steps", 0) or 0) if placement is not None else 0
    if every:
        raise ConfigError(f"expert_cache={getattr(cache, 'name', '?')} with expert_placement="
                          f"{getattr(placement, 'name', '?')} re-planning every {every} steps is not modelled "
                          "(a re-plan would move offloaded experts); set its step_interval=0 or expert_cache=none")
