"""``evictor=lfu``: give up the evictable block used least often, counting recent uses more.

Each cached block keeps a use count that decays exponentially on a logical clock ``t`` the evictor
keeps (one tick per insert, hit and release it is told of; no wall time), with a half-life of
``half_life`` ticks::

    n(t) = n(t0) * 2 ** (-(t - t0) / half_life)      on_insert: n = 1;  on_hit: n(t) += 1

so a block that was hot long ago loses to a newer one once its count has halved enough times
(a block hit ``k`` times is outlived after about ``half_life * log2(k)`` ticks). Eviction takes the
evictable block with the smallest ``n(now)``; ties go to the one released longest ago.

Every count decays by the same factor, so the order never changes as time passes: the evictor
stores the time-invariant key ``log2(n(t0)) + t0 / half_life`` (= ``log2(n(t)) + t / half_life``
for every ``t``), and a block's key changes only on its own hit, which also takes it out of the
candidates. The candidates therefore sit in a heap keyed once at release (entries of blocks hit
since are skipped lazily): ``evict`` is O(log n) amortised, every ``on_*`` O(1) or O(log n).

Source: LFU with exponential aging (LRFU's decayed count; Lee et al., IEEE Trans. Computers 2001).
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from typing import Optional

from servelab.plugin_api import CachedBlock, Evictor, EvictorContext


@dataclass
class LfuConfig:
    half_life: Optional[float] = None  # ticks (cache events); null = 4 x num_blocks, a few pool turnovers


def resolved_half_life(value: float | None, context: EvictorContext) -> float:
    """``value`` checked (> 0), or the default for ``context``'s pool; ValueError names the key."""
    if value is None:
        return 4.0 * max(1, context.num_blocks)
    if not value > 0:  # also refuses NaN
        raise ValueError(f"evictor.half_life={value:g} must be > 0")
    return float(value)


def bumped(key: float, now: float) -> float:
    """The invariant key of a decayed count after one more use at scaled time ``now`` (= t / half_life)."""
    return now + math.log2(1.0 + 2.0 ** (key - now))


class LazyHeap:
    """A min-heap of ``(key, stamp, block)`` in which an entry counts only while ``stamps[block]`` is
    its stamp; stale entries are skipped on pop and dropped when they outnumber the live ones."""

    def __init__(self, stamps: list[int]) -> None:
        self.entries: list[tuple[float, int, int]] = []
        self.stamps = stamps
        self.live = 0

    def push(self, key: float, stamp: int, block: int) -> None:
        heapq.heappush(self.entries, (key, stamp, block))
        self.live += 1
        if len(self.entries) > 2 * self.live + 64:
            stamps = self.stamps
            self.entries = [e for e in self.entries if stamps[e[2]] == e[1]]
            heapq.heapify(self.entries)

    def discard(self) -> None:
        """One live entry was invalidated (its block's stamp changed)."""
        self.live -= 1

    def pop(self) -> int | None:
        entries, stamps = self.entries, self.stamps
        while entries:
            _, stamp, block = heapq.heappop(entries)
            if stamps[block] == stamp:
                self.live -= 1
                return block
        return None


class LfuEvictor(Evictor):
    """Least (exponentially decayed) frequently used first; ties: least recently released."""

    name = "lfu"
    Config = LfuConfig

    def __init__(self, config: LfuConfig, context: EvictorContext) -> None:
        super().__init__(config, context)
        self.half_life = resolved_half_life(config.half_life, context)
        self.ticks = 0
        self.keys = [0.0] * context.num_blocks
        self.stamps = [-1] * context.num_blocks  # release tick while evictable, else -1
        self.heap = LazyHeap(self.stamps)

    def on_insert(self, entry: CachedBlock) -> None:
        self.ticks += 1
        self.keys[entry.block] = self.ticks / self.half_life  # log2(1) + t / half_life

    def on_hit(self, block: int) -> None:
        self.ticks += 1
        self.keys[block] = bumped(self.keys[block], self.ticks / self.half_life)
        if self.stamps[block] >= 0:
            self.stamps[block] = -1
            self.heap.discard()

    def on_release(self, block: int) -> None:
        self.ticks += 1
        self.stamps[block] = self.ticks
        self.heap.push(self.keys[block], self.ticks, block)

    def evict(self) -> int | None:
        block = self.heap.pop()
        if block is not None:
            self.stamps[block] = -1
        return block
