"""Which of a mixture-of-experts model's routed experts stay in GPU memory when the rest live in host
memory (expert offloading): the ``expert_cache`` plugin kind (``expert_cache=<name>``).

With ``expert_cache=none`` (the default) every expert is resident and nothing here runs. Any other
cache holds ``sim.moe.expert_cache_slots`` experts of each rank's share in each MoE layer (the
memory plan reserves only those, so the KV pool grows by the offloaded experts' bytes); the others
stay in host memory and cross the host link when a step's tokens are routed to them.

The simulator (:mod:`servelab.sim.moe_cache`) asks :meth:`ExpertCache.start` for the resident set of
the first step (loaded at start-up, not priced), then after every step calls :meth:`ExpertCache.keep`
with the set that was resident during the step and the tokens each expert received; the answer is the
set resident for the next step. Masks and counts are ``[moe_layers, expert_parallel_size,
experts_per_rank]``: entry ``[l, r, j]`` is slot ``j`` of rank ``r``'s share in MoE layer ``l`` (the
``expert_placement`` plan's slot; under ``linear`` with one rank, expert ``j``).

- A routed expert that was not resident is a **miss**: loaded on demand when its layer's router has
  run, the layer waiting for it. Every expert a step touched is on the GPU after its layer ran (streamed
  through the layer's slots), so :meth:`ExpertCache.keep` may keep any of them at no cost.
- An expert in the answer that was neither resident nor touched is a **prefetch**: loaded ahead of
  the layer that needs it in the next step, overlapped with the compute before that layer.
- A cache with a ``lookahead_recall`` ``r`` guesses a layer's misses one MoE layer early (speculative
  loading): as many loads as the layer has misses are issued at the previous layer's router, each right
  with probability ``r``; the misses it guessed wrong are loaded on demand after them.

Contracts (``servelab check-plugin expert_cache=<name>``, :mod:`servelab.kit.expert_cache_contracts`):
never more than ``cache_slots`` resident per rank and layer, the right shape, and the same answers for
the same inputs (no clock, no hidden randomness). A routed expert is resident when it is priced by
construction (the simulator loads every miss). No torch: a cache package imports this through
``servelab.plugin_api``.
"""

from __future__ import annotations

from abc import abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from servelab.core.errors import ConfigError
from servelab.core.interfaces import Plugin


@dataclass(frozen=True)
class ExpertCacheContext:
    """What a cache is built for. ``experts_per_rank``: the slots of each rank's share (the placement's
    ``slots_per_rank``); ``cache_slots``: how many of them stay on the GPU per MoE layer
    (``sim.moe.expert_cache_slots``; equal to ``experts_per_rank`` when nothing is offloaded). A dense
    model: all zero but ``expert_parallel_size``."""

    num_experts: int
    num_moe_layers: int
    expert_parallel_size: int
    experts_per_rank: int
    cache_slots: int
    seed: int = 0

    @property
    def shape(self) -> tuple[int, int, int]:
        return (self.num_moe_layers, self.expert_parallel_size, self.experts_per_rank)


class ExpertCache(Plugin):
    """Base of every expert cache: :meth:`keep` returns the next step's resident set (module docstring)."""

    context_type: ClassVar[type | None] = ExpertCacheContext
    #: True only for ``none``: every expert resident, the simulator prices no cache at all
    all_resident: ClassVar[bool] = False
    #: the share of a MoE layer's misses the cache learns one layer early (a pre-gate, or the next layer's
    #: gate applied to the current hidden state): the simulator loads that many guesses at the previous
    #: layer's router, right ones drawn with this probability (0: every miss loaded on demand)
    lookahead_recall: float = 0.0

    def __init__(self, config: Any, context: ExpertCacheContext) -> None:
        super().__init__(config, context)

    def start(self) -> np.ndarray:
        """The resident set of the first step (loaded before the run, not priced): the first
        ``cache_slots`` slots of every rank and layer."""
        c = self.context
        mask = np.zeros(c.shape, dtype=bool)
        mask[:, :, : c.cache_slots] = True
        return mask

    @abstractmethod
    def keep(self, resident: np.ndarray, touched: np.ndarray) -> np.ndarray:
        """The resident set for the next step: a bool mask of :attr:`ExpertCacheContext.shape`, at most
        ``cache_slots`` True per ``[layer, rank]``. ``resident``: the mask of the step that just ran;
        ``touched``: the tokens each slot's expert received in it (int, same shape)."""


def top_slots(score: np.ndarray, slots: int, allowed: np.ndarray | None = None) -> np.ndarray:
    """The mask of the ``slots`` highest ``score`` entries of each ``[layer, rank]`` row (ties: the lower
    slot index), only among ``allowed`` where given. The selection most caches end with."""
    s = np.asarray(score, dtype=float)
    if allowed is not None:
        s = np.where(allowed, s, -np.inf)
    order = np.argsort(-s, axis=-1, kind="stable")[..., :slots]
    mask = np.zeros(s.shape, dtype=bool)
    np.put_along_axis(mask, order, True, axis=-1)
    out: np.ndarray = mask & np.isfinite(s)
    return out


def check_mask(mask: Any, context: ExpertCacheContext, who: str) -> np.ndarray:
    """``mask`` as a bool array, or a :class:`ConfigError` naming ``who`` and the broken rule (shape,
    more than ``cache_slots`` resident in a layer of a rank)."""
    arr = np.asarray(mask)
    if arr.shape != context.shape or arr.dtype != bool:
        raise ConfigError(f"{who}: a resident set is a bool mask of shape [moe_layers, ep, experts_per_rank] = "
                          f"{list(context.shape)}, got {list(arr.shape)} of {arr.dtype}")
    held = arr.sum(axis=-1)
    if held.size and held.max() > context.cache_slots:
        layer, rank = np.unravel_index(int(held.argmax()), held.shape)
        raise ConfigError(f"{who}: MoE layer {layer} of rank {rank} keeps {int(held.max())} experts resident, "
                          f"over the cache's {context.cache_slots} slots (sim.moe.expert_cache_slots)")
    return arr
