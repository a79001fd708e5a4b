"""The conformance kit's evictor checks (``servelab check-plugin evictor=<name>``).

An evictor only chooses which cached prefix block the paged allocator gives up for room; it never
changes what is computed. Every random scenario runs it behind ``allocator=paged
allocator.prefix_caching=true`` (:data:`EVICTOR_STACK`), so tokens, KV integrity, leaks and aborts
are checked as for any plugin. This module holds what is particular to evictors:

- :func:`victim_problem`: which contract an answer of ``evict()`` breaks (a block a request still
  references, a block that is not cached, or None while cached blocks are evictable); the kit checks
  every answer in every run with it, before the allocator acts on it;
- :func:`event_script`: the evictor alone, driven through seeded cache events (insert, hit, release,
  evict) against a model of which blocks are evictable; a failure prints the events that led to it;
- :func:`ladder`: a fixed shared-prefix workload through pools from large to thrashing. In a pool
  that holds every block nothing is evicted, so the prefix hits must equal the ideal
  (:func:`ideal_cached_tokens`, computed independently) and lru's in the same scenario;
- :func:`drain_problem`: after a run every block is free again, and a sequence asking for the whole
  pool gets it: each cached block evicted exactly once, then handed out again.

The checks read the paged allocator's own state (``evictable``, ``block_hash``, ``ref_counts``,
``cached``); an allocator given as an override is checked the same way where it keeps them (a
subclass of the paged one does).
"""

from __future__ import annotations

import hashlib
import random

from servelab.core.interfaces import CachedBlock
from servelab.core.request import Request, Sequence

EVICTOR_STACK = ("allocator=paged", "allocator.prefix_caching=true")
LADDER_BLOCK_SIZE = 4
SCRIPT_SEEDS, SCRIPT_EVENTS, SCRIPT_BLOCKS = (0, 1, 2), 400, 12


def victim_problem(block, allocator) -> tuple[str, str] | None:
    """``(contract, why)`` when ``block``, an answer of ``evict()``, is not one of the paged
    ``allocator``'s evictable blocks; None when it is."""
    if block in allocator.evictable:
        return None
    if block is None:
        return "victim given", f"evict() returned None while {len(allocator.evictable)} cached blocks are evictable"
    if not (isinstance(block, int) and 0 <= block < allocator.num_blocks) or allocator.block_hash[block] is None:
        return "victim is cached", f"evict() returned {block!r}, which is not a cached block (free, never cached, " \
                                   "already evicted or outside the pool)"
    return "live block kept", f"evict() returned block {block}, which {allocator.ref_counts[block]} running " \
                              "request(s) still reference"


# ---- the evictor alone ------------------------------------------------------------------------
class _ScriptPool:
    """What the paged allocator keeps, for :func:`event_script`: ref counts, cached digests, free
    blocks, and which content node each cached block holds (nodes form prefix trees)."""

    def __init__(self, num_blocks: int, seed: int) -> None:
        self.num_blocks, self.seed = num_blocks, seed
        self.ref_counts = [0] * num_blocks
        self.block_hash: list[bytes | None] = [None] * num_blocks
        self.evictable: set[int] = set()
        self.free = list(range(num_blocks))
        self.node_of: dict[int, int] = {}  # cached block -> its content node
        self.parent: list[int] = []  # node -> parent node (-1: the chain's root)
        self.position: list[int] = []

    def digest(self, node: int) -> bytes:
        return b"" if node < 0 else hashlib.blake2b(f"{self.seed}-{node}".encode(), digest_size=16).digest()


def event_script(evictor, seed: int, num_blocks: int = SCRIPT_BLOCKS,
                 events: int = SCRIPT_EVENTS) -> tuple[str, str] | None:
    """Drive ``evictor`` (built for ``num_blocks`` blocks) through ``events`` seeded cache events as
    the paged allocator sends them, checking every ``evict()`` answer: ``(contract, why)`` for the
    first that breaks one (or the first raise: ``plugin raised``), None when all hold.

    Contents form prefix trees: a new block mostly extends a cached one, sometimes one that was
    evicted meanwhile (the allocator can cache a block whose parent is gone), and evicted contents
    come back. Hits and releases come in any order the interface allows; a block's last release is
    its ``on_release``.
    """
    rng = random.Random(f"evictor-script-{seed}")
    pool, log = _ScriptPool(num_blocks, seed), []

    def call(event: str, *args):
        log.append(f"on_insert(block={args[0].block}, position={args[0].position})" if event == "on_insert"
                   else f"{event}({', '.join(map(repr, args))})")
        return getattr(evictor, event)(*args)

    def where() -> str:
        return f"event script seed {seed}, {num_blocks} blocks; the last events: {'; '.join(log[-6:])}"

    try:
        for _ in range(events):
            op, cached = rng.random(), list(pool.node_of)
            live = [b for b in cached if pool.ref_counts[b] > 0]
            if op < 0.35 or (op >= 0.85 and not pool.evictable):
                if not pool.free and pool.evictable:  # the allocator needs a block: evict first
                    problem = _evict(pool, call)
                    if problem:
                        return problem[0], f"{problem[1]} ({where()})"
                if pool.free:
                    _insert(pool, rng, call)
            elif op < 0.55 and cached:
                block = rng.choice(cached)
                pool.ref_counts[block] += 1
                pool.evictable.discard(block)
                call("on_hit", block)
            elif op < 0.85 and live:
                block = rng.choice(live)
                pool.ref_counts[block] -= 1
                if pool.ref_counts[block] == 0:
                    pool.evictable.add(block)
                    call("on_release", block)
            elif pool.evictable:
                problem = _evict(pool, call)
                if problem:
                    return problem[0], f"{problem[1]} ({where()})"
    except Exception as exc:  # noqa: BLE001 - any raise is reported with the events before it
        return "plugin raised", f"{type(exc).__name__} in {log[-1]}: {exc} ({where()})"
    return None


def _insert(pool: _ScriptPool, rng: random.Random, call) -> None:
    """Cache a content node in a free block, referenced by the request that computed it."""
    cached_nodes = set(pool.node_of.values())
    gone = [n for n in range(len(pool.parent)) if n not in cached_nodes]
    if gone and rng.random() < 0.25:  # content evicted earlier is computed and cached again
        node = rng.choice(gone)
    else:
        r = rng.random()
        parent = (rng.choice(sorted(cached_nodes)) if cached_nodes and r < 0.75 else
                  rng.choice(gone) if gone and r < 0.85 else -1)
        pool.parent.append(parent)
        pool.position.append(pool.position[parent] + 1 if parent >= 0 else 0)
        node = len(pool.parent) - 1
    block = pool.free.pop()
    pool.ref_counts[block] = 1
    pool.block_hash[block] = pool.digest(node)
    pool.node_of[block] = node
    call("on_insert", CachedBlock(block, pool.digest(node), pool.digest(pool.parent[node]), pool.position[node]))


def _evict(pool: _ScriptPool, call) -> tuple[str, str] | None:
    """Ask for a victim: the contract its answer breaks, or None after dropping it from the cache."""
    block = call("evict")
    problem = victim_problem(block, pool)
    if problem:
        return problem
    pool.evictable.remove(block)
    pool.block_hash[block] = None
    del pool.node_of[block]
    pool.free.append(block)
    return None


# ---- a fixed workload through pools from large to thrashing ---------------------------------------
def ladder_requests() -> list[Request]:
    """Shared-prefix traffic in arrival order: three documents of 3-7 blocks, each asked several
    questions, some questions followed up (the next prompt repeats the previous one), some prompts
    sent again verbatim. Unique tokens besides, so only the planned prefixes are shared."""
    rng = random.Random("evictor-ladder")
    fresh = iter(rng.sample(range(1, 1000), 999))
    docs = [[next(fresh) for _ in range(LADDER_BLOCK_SIZE * n)] for n in (5, 3, 7)]
    prompts: list[tuple[int, ...]] = []
    for i in range(24):
        roll = rng.random()
        if prompts and roll < 0.15:
            prompt = rng.choice(prompts)  # sent again verbatim
        elif prompts and roll < 0.35 and len(prompts[-1]) < 44:
            prompt = prompts[-1] + tuple(rng.choices(range(1, 1000), k=rng.randint(2, 7)))  # a follow-up
        else:
            prompt = tuple(docs[rng.choice((0, 0, 1, 2))]) + tuple(next(fresh, 7) for _ in range(rng.randint(1, 9)))
        prompts.append(prompt)
    return [Request(f"e{i}", p, rng.randint(2, 5), arrival_time=0.0) for i, p in enumerate(prompts)]


def ideal_cached_tokens(requests: list[Request], block_size: int) -> int:
    """Prompt tokens served from an unbounded cache when every earlier request was computed first
    (``experiments/prefix_caching_trace/analyze.py``'s ``ideal_hit_rate``): each prompt reuses its
    longest run of leading full blocks seen before, never its last token."""
    seen: set[tuple[int, ...]] = set()
    cached, bs = 0, block_size
    for r in requests:
        tokens, n = r.prompt_token_ids, (r.prompt_len - 1) // bs
        cached += bs * next((j for j in range(n) if tokens[:(j + 1) * bs] not in seen), n)
        seen.update(tokens[:(j + 1) * bs] for j in range(r.prompt_len // bs))
    return cached


def ladder(max_model_len: int = 64) -> list[tuple[str, tuple[str, ...], int]]:
    """``(label, overrides, num_blocks)`` of each run of :func:`ladder_requests`: a pool that holds
    every block (one request at a time, then four), half of what an unbounded cache ends up holding,
    and barely the largest request."""
    bs, requests = LADDER_BLOCK_SIZE, ladder_requests()
    need = [-(-(r.prompt_len + r.max_tokens) // bs) for r in requests]
    unbounded = sum(need) - ideal_cached_tokens(requests, bs) // bs
    base = (*EVICTOR_STACK, "scheduler=fcfs", "preemption=recompute", f"block_size={bs}",
            f"max_model_len={max_model_len}")
    return [("large pool, one request at a time", (*base, "max_num_seqs=1", "chunked_prefill=false",
                                                    f"max_num_batched_tokens={max_model_len}"), sum(need)),
            ("large pool", (*base, "max_num_seqs=4", "chunked_prefill=true", "max_num_batched_tokens=16"), sum(need)),
            ("half the cache", (*base, "max_num_seqs=4", "chunked_prefill=true", "max_num_batched_tokens=16"),
             unbounded // 2),
            ("thrashing", (*base, "max_num_seqs=4", "chunked_prefill=false", f"max_num_batched_tokens={max_model_len}"),
             max(need) + 1)]


def drain_problem(allocator) -> str | None:
    """Why the paged ``allocator``'s blocks are not all reusable once a run ended, or None: every
    block must be free, and a sequence asking for the whole pool gets every block (each cached one
    evicted once; a bad answer of ``evict()`` raises from the kit's guard), after which nothing is
    cached and every block is free again."""
    n, bs = allocator.num_blocks, allocator.block_size
    if allocator.num_free_blocks() != n:
        return f"{n - allocator.num_free_blocks()} of {n} blocks are not free once every request ended"
    cached = len(allocator.cached)
    probe = Sequence(Request("evictor-probe", (1,) * (n * bs), 1))
    if not allocator.allocate_slots(probe, n * bs):
        return f"a sequence asking for all {n} free blocks was refused ({cached} of them cached)"
    table = allocator.block_table(probe.id)
    allocator.free(probe)
    if sorted(table) != list(range(n)):
        return f"a sequence asking for all {n} blocks got {len(set(table))} distinct ones after {cached} evictions"
    if allocator.cached or allocator.num_free_blocks() != n:
        return (f"after evicting all {cached} cached blocks, {len(allocator.cached)} are still cached and "
                f"{allocator.num_free_blocks()} of {n} free")
    return None


def real_model_case() -> tuple[tuple[str, ...], list[Request]]:
    """Overrides and requests of the tiny-model check for an evictor: prompts sharing prefixes of
    one to three blocks, two at a time through a pool too small to keep them all."""
    prefix = tuple((5 * j) % 300 + 1 for j in range(12))
    requests = [Request(f"m{i}", prefix[:4 + 4 * (i % 3)] + tuple((7 * i + 3 * j) % 300 + 1 for j in range(3 + i)),
                        5, arrival_time=0.0) for i in range(6)]
    return (*EVICTOR_STACK, "num_kv_blocks=12", "block_size=4", "max_num_batched_tokens=32", "max_num_seqs=2"), requests
