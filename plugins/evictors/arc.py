"""``evictor=arc``: Adaptive Replacement Cache (Megiddo & Modha, "ARC: A Self-Tuning, Low Overhead
Replacement Cache", FAST 2003), adapted to a prefix cache whose blocks may be in use.

ARC splits the cache in two LRU lists: ``T1`` holds blocks used once since they entered the cache,
``T2`` blocks used at least twice (an insert is a use, every hit another). It remembers the digests it
evicted in two ghost lists, ``B1`` (evicted from ``T1``) and ``B2`` (from ``T2``), and adapts a target
``p`` (0 <= p <= c, c = num_blocks) for the size of ``T1``: recomputing a digest that ``B1`` remembers
means ``T1`` was too small, one from ``B2`` that ``T2`` was::

    insert of a digest in B1:  p = min(c, p + max(1, |B2| / |B1|))   then the block joins T2
    insert of a digest in B2:  p = max(0, p - max(1, |B1| / |B2|))   then the block joins T2
    any other insert:          the block joins T1;   a hit moves a T1 block to T2

Adaptation (what differs from the paper, where every cached page may be replaced):

- Only evictable (unreferenced) blocks can go, so REPLACE chooses among them: the least recently
  released evictable block of ``T1`` when ``|T1| > p`` or ``T2`` has no evictable block, else that of
  ``T2``. ``|T1|`` and ``|T2|`` count every cached block (in use or not), as the paper's lists do.
  Recency within a list is release order: a block's last use ends when its last reference goes.
- The paper's tie rule ``x in B2 and |T1| = p`` is dropped: the evictor is not told which digest the
  room is for. The allocator asks for a victim only when the pool is full, so ``|T1| + |T2| <= c``
  always holds; the ghost lists are kept to ``c`` digests each (oldest forgotten first).
- A ghost hit comes as an insert (the evicted prefix was recomputed), not as a cache miss.

Cost: the evictable blocks of each list sit in an insertion-ordered dict, so every event is O(1).
"""

from __future__ import annotations

from collections import OrderedDict

from servelab.plugin_api import CachedBlock, Evictor, EvictorContext

_T1, _T2 = 1, 2


class ArcEvictor(Evictor):
    """ARC's two recency lists and adaptive split, choosing among evictable blocks only."""

    name = "arc"

    def __init__(self, config, context: EvictorContext) -> None:
        super().__init__(config, context)
        self.capacity = max(1, context.num_blocks)
        self.p = 0.0
        self.where = [0] * context.num_blocks  # _T1, _T2, or 0 when not cached
        self.digest: list[bytes | None] = [None] * context.num_blocks
        self.sizes = {_T1: 0, _T2: 0}
        self.evictable: dict[int, OrderedDict[int, None]] = {_T1: OrderedDict(), _T2: OrderedDict()}
        self.b1: OrderedDict[bytes, None] = OrderedDict()  # ghost digests, oldest first
        self.b2: OrderedDict[bytes, None] = OrderedDict()

    def on_insert(self, entry: CachedBlock) -> None:
        d = entry.digest
        if d in self.b1:
            self.p = min(float(self.capacity), self.p + max(1.0, len(self.b2) / len(self.b1)))
            del self.b1[d]
            where = _T2
        elif d in self.b2:
            self.p = max(0.0, self.p - max(1.0, len(self.b1) / len(self.b2)))
            del self.b2[d]
            where = _T2
        else:
            where = _T1
        self.where[entry.block] = where
        self.digest[entry.block] = d
        self.sizes[where] += 1

    def on_hit(self, block: int) -> None:
        where = self.where[block]
        self.evictable[where].pop(block, None)
        if where == _T1:
            self.sizes[_T1] -= 1
            self.sizes[_T2] += 1
            self.where[block] = _T2

    def on_release(self, block: int) -> None:
        self.evictable[self.where[block]][block] = None

    def evict(self) -> int | None:
        t1, t2 = self.evictable[_T1], self.evictable[_T2]
        if t1 and (self.sizes[_T1] > self.p or not t2):
            where, ghosts = _T1, self.b1
        elif t2:
            where, ghosts = _T2, self.b2
        else:
            return None
        block, _ = self.evictable[where].popitem(last=False)
        self.sizes[where] -= 1
        self.where[block] = 0
        digest = self.digest[block]
        assert digest is not None  # an evictable block is a cached one
        ghosts[digest] = None
        self.digest[block] = None
        if len(ghosts) > self.capacity:
            ghosts.popitem(last=False)
        return block
