"""``evictor=cost_aware``: give up the block whose loss costs least: recompute cost x chance of reuse.

Cost. Losing block ``b`` (at chain ``position`` k, ``bs`` tokens) means prefilling its tokens again at
context ``k*bs + 1 .. k*bs + bs``, priced by the policies' step-cost model (``coefficient_vector()``:
``c1`` s per prefill token, ``c3`` s per 1000 attended tokens)::

    cost(b) = c1 * bs + c3 * attended / 1000,    attended = sum_{i=1..bs} (k*bs + i) = k*bs*bs + bs*(bs+1)/2

Reuse. The chance that ``b`` is used again is taken proportional to its exponentially decayed use
count ``n(t)`` (as in ``evictor=lfu``): ``n = 1`` on insert, ``+1`` per hit, halving every
``half_life`` ticks of a logical clock that counts the insert, hit and release events. The evictor
gives up the evictable block with the smallest ``r(b) ** cost_exponent * n(t)``, where ``r(b) =
cost(b) / cost(root block)`` (``cost_exponent=0`` is a decayed LFU; ties: least recently released
first). Because every ``n`` decays by the same factor, the order is fixed in time and the heap key
``cost_exponent * log2(r) + log2(n(t0)) + t0 / half_life`` is computed once, at release, with the
coefficients the cost model has then. ``r`` is relative so that keys computed at different times
compare: the online fit moves the model's overall speed a lot (its prior, 1 ms per token, is ~100x
the fitted cost of a small model), which would make blocks released early look ~2**7 times dearer;
only the ratio ``c3 / c1`` enters ``r``. This is GreedyDual-Size-Frequency's score (Cherkasova 1998)
with size 1 and exponential aging in place of its inflation value.

Leaves first. A block whose children (blocks cached with its digest as ``parent``) are still cached is
given up only when no evictable block without cached children exists: losing an inner block of a
shared prefix cuts every cached block after it off from lookups. Children are counted per parent
digest from ``on_insert`` and evictions; the evictable blocks sit in two heaps (leaves, inner) with
lazy invalidation, and a block moves between them when its first child arrives or its last one
leaves. ``evict`` is O(log n) amortised; each ``on_*`` O(1) or O(log n).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

from servelab.plugin_api import CachedBlock, Evictor, EvictorContext
from servelab.plugins.evictors.lfu import LazyHeap, bumped, resolved_half_life


@dataclass
class CostAwareConfig:
    half_life: Optional[float] = None  # ticks of the reuse estimate; null = 4 x num_blocks
    cost_exponent: float = 1.0  # weight of the recompute cost against reuse (0 = decayed LFU, leaves first)


class CostAwareEvictor(Evictor):
    """Cheapest expected loss first (relative recompute cost x decayed use count), leaves before inner blocks."""

    name = "cost_aware"
    Config = CostAwareConfig

    def __init__(self, config: CostAwareConfig, context: EvictorContext) -> None:
        super().__init__(config, context)
        self.half_life = resolved_half_life(config.half_life, context)
        if not config.cost_exponent >= 0:
            raise ValueError(f"evictor.cost_exponent={config.cost_exponent:g} must be >= 0")
        self.cost_exponent = float(config.cost_exponent)
        n = context.num_blocks
        self.ticks = 0
        self.use_keys = [0.0] * n  # log2(n(t)) + t / half_life
        self.heap_keys = [0.0] * n
        self.digest: list[bytes | None] = [None] * n
        self.parent: list[bytes] = [b""] * n
        self.position = [0] * n
        # While evictable: 2 * release tick + 1 if in the inner heap (the tick keeps the tie order
        # across a move, the bit tells the heaps' entries apart); otherwise -1.
        self.stamps = [-1] * n
        self.leaves = LazyHeap(self.stamps)
        self.inner = LazyHeap(self.stamps)
        self.block_of: dict[bytes, int] = {}
        self.children: dict[bytes, int] = {}  # parent digest -> cached blocks extending it
        self._coef: tuple[float, ...] = ()
        self._slope = 0.0  # r(position) = 1 + slope * position under the coefficients _coef

    def recompute_cost(self, position: int) -> float:
        """Predicted seconds to prefill the ``block_size`` tokens of a block at chain ``position``."""
        bs = self.context.block_size
        _, per_token, _, per_1k = self.context.cost_model.coefficient_vector()
        attended = position * bs * bs + bs * (bs + 1) // 2
        return per_token * bs + per_1k * attended / 1000.0

    def relative_cost(self, position: int) -> float:
        """``recompute_cost(position) / recompute_cost(0)`` (1 when the model prices nothing)."""
        coef = self.context.cost_model.coefficient_vector()
        if coef != self._coef:  # refitted: the slope of r in position changes
            bs, (_, per_token, _, per_1k) = self.context.block_size, coef
            root = per_token * bs + per_1k * (bs * (bs + 1) // 2) / 1000.0
            self._coef, self._slope = coef, (per_1k * bs * bs / 1000.0 / root if root > 0 else 0.0)
        return 1.0 + self._slope * position

    def on_insert(self, entry: CachedBlock) -> None:
        block = entry.block
        self.ticks += 1
        self.use_keys[block] = self.ticks / self.half_life  # log2(1) + t / half_life
        self.digest[block], self.parent[block], self.position[block] = entry.digest, entry.parent, entry.position
        self.block_of[entry.digest] = block
        siblings = self.children.get(entry.parent, 0)
        self.children[entry.parent] = siblings + 1
        if siblings == 0:
            self._move(self.block_of.get(entry.parent), inner=True)

    def on_hit(self, block: int) -> None:
        self.ticks += 1
        self.use_keys[block] = bumped(self.use_keys[block], self.ticks / self.half_life)
        stamp = self.stamps[block]
        if stamp >= 0:
            self.stamps[block] = -1
            (self.inner if stamp & 1 else self.leaves).discard()

    def on_release(self, block: int) -> None:
        self.ticks += 1
        key = self.use_keys[block]
        if self.cost_exponent:
            key += self.cost_exponent * math.log2(self.relative_cost(self.position[block]))
        self.heap_keys[block] = key
        digest = self.digest[block]
        inner = digest is not None and self.children.get(digest, 0) > 0
        self.stamps[block] = stamp = 2 * self.ticks + inner
        (self.inner if inner else self.leaves).push(key, stamp, block)

    def evict(self) -> int | None:
        block = self.leaves.pop()
        if block is None:
            block = self.inner.pop()
            if block is None:
                return None
        self.stamps[block] = -1
        digest = self.digest[block]
        assert digest is not None  # an evictable block is a cached one
        del self.block_of[digest]
        self.digest[block] = None
        parent = self.parent[block]
        left = self.children[parent] - 1
        if left:
            self.children[parent] = left
        else:
            del self.children[parent]
            self._move(self.block_of.get(parent), inner=False)
        return block

    def _move(self, block: int | None, inner: bool) -> None:
        """Put evictable ``block`` (if it is one) in the inner or the leaf heap, keeping its tie order."""
        if block is None or self.stamps[block] < 0 or bool(self.stamps[block] & 1) == inner:
            return
        (self.leaves if inner else self.inner).discard()
        self.stamps[block] = (self.stamps[block] & ~1) | inner
        (self.inner if inner else self.leaves).push(self.heap_keys[block], self.stamps[block], block)
