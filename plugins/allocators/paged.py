"""Paged KV-cache allocation (vLLM's PagedAttention) with optional prefix caching.

Blocks are ref-counted. With ``prefix_caching`` on, each *full* block is identified by its chained
digest, computed once and kept on the sequence (``Sequence.block_hashes``,
:mod:`servelab.core.block_hash`: BLAKE2b of the parent block's digest and the block's token ids;
a request's ``cache_salt`` seeds the chain, so requests with different salts never share a block). An admitted sequence reuses every cached full block
of its prefix (ref + 1) and computes only the rest. A freed block that has a hash stays cached
(evictable) and is evicted only when the pool needs room; blocks without a hash are reused first (the one
freed last first: a small, cache-warm working set).
Only full blocks are ever shared, so copy-on-write is never needed: a partial last block always
belongs to one sequence, and it is hashed (and becomes shareable) only once it is full and computed.

Which cached block to give up when the pool needs room is the evictor's choice (``evictor=<name>``,
default ``lru``): the allocator reports each cache event to it (insert, hit, release) and asks it
for a victim only when no never-cached block is free; subscribers (:meth:`BlockAllocator.subscribe`:
the KV tiers) hear the same events, and each eviction before the block is reused.
:meth:`PagedAllocator.cached_prefix_len` answers how much of a waiting request the cache holds, from
the sequence's digests.

Swap: with a host pool attached (``backend.num_swap_blocks`` / ``swap_space_gb``), a victim's
blocks are copied to host blocks and its device blocks released (a shared prefix block stays for
its other users; the victim gets a private host copy); swapping in takes fresh device blocks and
re-registers the hashes of its full blocks when no other block holds them.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from servelab.plugin_api import (BlockAllocator, CachedBlock, EvictorContext, EvictorError, Sequence,  # noqa: F401
                                 StepCostModel, block_digest, block_hashes, root_digest)  # block_digest: re-exported
from servelab.plugins.evictors.lru import LruEvictor


@dataclass
class PagedConfig:
    prefix_caching: bool = False


class PagedAllocator(BlockAllocator):
    """Fixed-size blocks handed out one at a time as sequences grow."""

    name = "paged"
    Config = PagedConfig

    def __init__(self, config, context) -> None:
        super().__init__(config, context)
        num_blocks, block_size = self.num_blocks, self.block_size
        self.ref_counts = [0] * num_blocks
        self.block_hash: list[bytes | None] = [None] * num_blocks
        # a stack (the block freed last is taken first): a run's working set of blocks stays small and
        # hot in the CPU's caches, where a queue would cycle through the whole pool (the simulator's
        # pools hold ~100k blocks: a miss per block taken and freed was ~10% of a run)
        self.free_plain: list[int] = list(range(num_blocks - 1, -1, -1))
        self.evictable: set[int] = set()  # cached blocks nobody references (the evictor orders them)
        if self.evictor is None:  # built alone (a test): the default evictor
            self.evictor = LruEvictor(LruEvictor.Config(), EvictorContext(num_blocks, block_size, StepCostModel()))
        # bound once: these run for every cached block a request touches
        self._on_hit, self._on_release = self.evictor.on_hit, self.evictor.on_release
        self._on_insert = self.evictor.on_insert
        self._evictor_name = type(self.evictor).name
        self.cached: dict[bytes, int] = {}  # block digest -> block id
        self.tables: dict[str, list[int]] = {}
        self.hashes: dict[str, list[bytes]] = {}  # digests of each sequence's full computed blocks
        self.slots_used: dict[str, int] = {}
        self._total_slots_used = 0
        self._table_blocks = 0  # sum of len(table) over self.tables: usage_stats runs every step
        # a deque, or the host memory it shares with the host tier (kv_tiers on: servelab.kv.tiers.host_memory)
        self.free_host: deque[int] = (self.context.host_blocks if getattr(self.context, "host_blocks", None) is not None
                                      else deque(range(self.num_swap_blocks)))
        self.swapped: dict[str, tuple[list[int], int]] = {}  # seq id -> (host blocks, slots used)
        # blocks taken and released inline (a prompt's ~100 blocks per admission and per end) unless a
        # subclass takes or releases them its own way
        cls = type(self)
        self._inline_blocks = cls._take_block is PagedAllocator._take_block and cls._release is PagedAllocator._release

    @property
    def publishes_block_events(self) -> bool:  # type: ignore[override]  # a property of the config
        return bool(self.config.prefix_caching)

    # ---- the interface ------------------------------------------------------------------
    def allocate_slots(self, seq: Sequence, num_new_tokens: int) -> bool:
        seq_id = seq.request.id
        table = self.tables.get(seq_id)
        if table is None:
            table = self.tables[seq_id] = []
        total = seq.num_computed_tokens + num_new_tokens
        need = -(-total // self.block_size) - len(table)
        if need > 0:  # most decode steps need no new block: keep that path short
            free = self.free_plain
            if need > len(free) + len(self.evictable):
                return False
            if need <= len(free) and self._inline_blocks:  # _take_block, inlined: no eviction needed
                taken = free[-need:]
                del free[-need:]
                taken.reverse()
                refs = self.ref_counts
                for block in taken:
                    refs[block] = 1
                table += taken
            else:
                for _ in range(need):  # one by one through _take_block: a subclass may take them otherwise
                    table.append(self._take_block())
            self._table_blocks += need
        used = self.slots_used
        self._total_slots_used += total - used.get(seq_id, 0)
        used[seq_id] = total
        return True

    def free(self, seq: Sequence) -> None:
        host_blocks, _ = self.swapped.pop(seq.id, ((), 0))
        self.free_host.extend(host_blocks)
        table = self.tables.pop(seq.id, None)
        if table:
            self._table_blocks -= len(table)
        self.hashes.pop(seq.id, None)
        self._total_slots_used -= self.slots_used.pop(seq.id, 0)
        if not table:
            return
        if not self._inline_blocks:
            for block in reversed(table):  # tail blocks end up evicted first
                self._release(block)
            return
        refs, digests, free_plain = self.ref_counts, self.block_hash, self.free_plain
        if not self.config.prefix_caching:  # no block is shared or cached: each had one reference
            for block in table:
                refs[block] = 0
            free_plain += reversed(table)  # the first block on top
            return
        for block in reversed(table):  # _release, inlined for a block nobody else holds and no cache knows
            left = refs[block] = refs[block] - 1
            if left == 0:
                if digests[block] is None:
                    free_plain.append(block)
                else:
                    self._unreferenced(block)

    def release_slots(self, seq: Sequence, num_tokens: int) -> None:
        table = self.tables.get(seq.id)
        if table is None:
            return
        keep = -(-num_tokens // self.block_size)
        while len(table) > keep:  # blocks past the end hold only rejected drafts: never hashed
            self._release(table.pop())
        self._total_slots_used += num_tokens - self.slots_used.get(seq.id, 0)
        self.slots_used[seq.id] = num_tokens

    def block_table(self, seq_id: str) -> list[int]:
        return self.tables.get(seq_id, [])

    def num_free_blocks(self) -> int:
        return len(self.free_plain) + len(self.evictable)

    def admit(self, seq: Sequence) -> int:
        if not self.config.prefix_caching:
            return 0
        table = self.tables.setdefault(seq.id, [])
        held = len(table)
        hashes = self.hashes.setdefault(seq.id, [])
        for h in self._prompt_digests(seq):
            block = self.cached.get(h)
            if block is None:
                break
            if self.ref_counts[block] == 0:
                self.evictable.remove(block)
            self.ref_counts[block] += 1
            try:
                self._on_hit(block)
            except Exception as exc:  # reported naming the evictor
                raise self._evictor_error("on_hit", block, exc) from exc
            for subscriber in self.block_subscribers:
                subscriber.on_block_hit(h, block)
            table.append(block)
            hashes.append(h)
        self._table_blocks += len(table) - held
        cached_tokens = len(table) * self.block_size
        self._total_slots_used += cached_tokens
        self.slots_used[seq.id] = cached_tokens
        return cached_tokens

    def cached_prefix_len(self, seq: Sequence) -> int:
        if not self.config.prefix_caching:
            return 0
        cached, hits = self.cached, 0
        for h in self._prompt_digests(seq):
            if h not in cached:
                break
            hits += 1
        return hits * self.block_size

    def can_allocate(self, seq: Sequence, num_new_tokens: int, num_cached_tokens: int = 0) -> bool:
        bs = self.block_size
        total = -(-(num_cached_tokens + num_new_tokens) // bs)
        available = len(self.free_plain) + len(self.evictable)
        if total - num_cached_tokens // bs > available:
            return False  # even with every hinted block a hit
        hits = 0
        if num_cached_tokens:
            cached, refs = self.cached, self.ref_counts
            for h in self._prompt_digests(seq)[:num_cached_tokens // bs]:
                block = cached.get(h)
                if block is None:
                    break  # the cache changed since the caller asked: the rest is allocated afresh
                hits += 1
                if refs[block] == 0:
                    available -= 1  # referencing a cached block takes it out of the evictable pool
        return total - hits <= available

    def _prompt_digests(self, seq: Sequence) -> list[bytes]:
        """Digests of ``seq``'s full blocks but the last token's (what a prefix hit matches), from
        ``seq.block_hashes``."""
        n = (seq.num_tokens - 1) // self.block_size  # the last token is always computed
        digests = block_hashes(seq, self.block_size)
        return digests if len(digests) == n else digests[:n]

    def on_tokens_computed(self, seq: Sequence) -> None:
        if not self.config.prefix_caching:
            return
        table, hashes = self.tables[seq.id], self.hashes.setdefault(seq.id, [])
        full = seq.num_computed_tokens // self.block_size
        if len(hashes) >= full:
            return
        digests = block_hashes(seq, self.block_size)
        parent = hashes[-1] if hashes else root_digest(seq)
        for j in range(len(hashes), full):
            h = digests[j]
            hashes.append(h)
            block = table[j]
            if self.block_hash[block] is None and h not in self.cached:
                self._cache(block, h, parent, j)
            parent = h

    # ---- fast-forward ---------------------------------------------------------------------
    def quiet_decode_tokens(self, seq: Sequence) -> int:
        """Decode steps until ``seq`` needs a new block, or (prefix caching) fills one: it is hashed."""
        computed, bs = seq.num_computed_tokens, self.block_size
        room = len(self.tables.get(seq.request.id, ())) * bs - computed
        if room <= 0:
            return 0
        if self.config.prefix_caching:
            if len(self.hashes.get(seq.request.id, ())) != computed // bs:
                return 0
            return min(room, bs - 1 - computed % bs)
        return room

    def count_quiet_decodes(self, num_tokens: int) -> None:
        self._total_slots_used += num_tokens

    def settle_quiet_decodes(self, seq: Sequence, num_tokens: int) -> None:
        self.slots_used[seq.request.id] += num_tokens

    def leaked_blocks(self) -> int:
        """Device blocks still referenced plus host blocks still held."""
        return sum(1 for r in self.ref_counts if r != 0) + self.num_swap_blocks - len(self.free_host)

    # ---- swap ---------------------------------------------------------------------------
    def can_swap_out(self, seq: Sequence) -> bool:
        return 0 < len(self.tables.get(seq.id, ())) <= len(self.free_host)

    def swap_out(self, seq: Sequence) -> list[tuple[int, int]]:
        table = self.tables[seq.id]
        if len(table) > len(self.free_host):
            raise RuntimeError(f"swap_out({seq.id!r}): needs {len(table)} host blocks, {len(self.free_host)} free")
        host = [self.free_host.popleft() for _ in table]
        used = self.slots_used.get(seq.id, 0)
        hashes = self.hashes.get(seq.id)
        self.free(seq)  # releases the device blocks (and forgets the hashes: restored below)
        if hashes is not None:
            self.hashes[seq.id] = hashes
        self.swapped[seq.id] = (host, used)
        return list(zip(table, host))

    def can_swap_in(self, seq: Sequence) -> bool:
        host, _ = self.swapped.get(seq.id, ((), 0))
        return bool(host) and len(host) <= self.num_free_blocks()

    def swap_in(self, seq: Sequence) -> list[tuple[int, int]]:
        host, used = self.swapped.pop(seq.id)
        table = [self._take_block() for _ in host]
        self.tables[seq.id] = table
        self._table_blocks += len(table)
        self.slots_used[seq.id] = used
        self._total_slots_used += used
        parent = root_digest(seq)
        for j, (block, h) in enumerate(zip(table, self.hashes.get(seq.id, ()))):
            if h not in self.cached:  # the copy is the only block holding this content now
                self._cache(block, h, parent, j)
            parent = h
        self.free_host.extend(host)
        return list(zip(host, table))

    def usage_stats(self) -> dict[str, float]:
        allocated = self._table_blocks * self.block_size
        waste = 1.0 - self._total_slots_used / allocated if allocated else 0.0
        return {"kv_waste_fraction": waste}

    # ---- helpers ------------------------------------------------------------------------
    def _cache(self, block: int, digest: bytes, parent: bytes, position: int) -> None:
        self.block_hash[block] = digest
        self.cached[digest] = block
        entry = CachedBlock(block, digest, parent, position)
        try:
            self._on_insert(entry)
        except Exception as exc:  # reported naming the evictor
            raise self._evictor_error("on_insert", entry, exc) from exc
        for subscriber in self.block_subscribers:
            subscriber.on_block_stored(digest, block)

    def _release(self, block: int) -> None:
        self.ref_counts[block] -= 1
        if self.ref_counts[block] == 0:
            if self.block_hash[block] is None:
                self.free_plain.append(block)
            else:
                self._unreferenced(block)

    def _unreferenced(self, block: int) -> None:
        """A cached block nobody references any more: evictable, and the evictor and subscribers hear it."""
        self.evictable.add(block)
        try:
            self._on_release(block)
        except Exception as exc:  # reported naming the evictor
            raise self._evictor_error("on_release", block, exc) from exc
        if self.block_subscribers:
            digest = self.block_hash[block]
            assert digest is not None  # an evictable block is a cached one
            for subscriber in self.block_subscribers:
                subscriber.on_block_freed(digest, block)

    def _take_block(self) -> int:
        block = self.free_plain.pop() if self.free_plain else self._evict()
        self.ref_counts[block] = 1
        return block

    def _evict(self) -> int:
        """Ask the evictor for a victim among the evictable blocks (the caller checked there is
        one), check it, and drop it from the cache."""
        assert self.evictor is not None  # set in __init__
        try:
            block = self.evictor.evict()  # not bound once: rare, and tests wrap it
        except Exception as exc:  # reported naming the evictor
            raise self._evictor_error("evict", None, exc) from exc
        if block not in self.evictable:
            where = f"evictor plugin {self._evictor_name!r}"
            if block is None:
                raise EvictorError(f"{where} returned no block while {len(self.evictable)} cached blocks are evictable")
            if not (isinstance(block, int) and 0 <= block < self.num_blocks) or self.block_hash[block] is None:
                raise EvictorError(f"{where} returned block {block!r}, which is not a cached block")
            raise EvictorError(f"{where} returned block {block}, which {self.ref_counts[block]} running "
                               "request(s) still reference")
        self.evictable.remove(block)
        digest = self.block_hash[block]
        assert digest is not None  # checked above: a cached block
        del self.cached[digest]
        self.block_hash[block] = None
        for subscriber in self.block_subscribers:
            subscriber.on_block_evicted(digest, block)
        return block

    def _evictor_error(self, event: str, arg, exc: Exception) -> EvictorError:
        call = f"{event}()" if arg is None else f"{event}({arg!r})"
        return EvictorError(f"evictor plugin {self._evictor_name!r} raised {type(exc).__name__} in {call}: {exc}")
