"""Block allocators on their own: ref counts, prefix caching, LRU eviction, swap, the contiguous
baseline, and the config errors of the memory keys."""

from __future__ import annotations

import pytest

from servelab.plugin_api import AllocatorContext
from servelab.core.interfaces import EngineLimits
from servelab.plugins.allocators.contiguous import ContiguousAllocator, ContiguousConfig, ReserveFor
from servelab.plugins.allocators.paged import PagedAllocator, PagedConfig
from servelab.core.request import Request, Sequence
from servelab.assemble.validate import validate
from servelab.core.errors import ConfigError

from memory_helpers import _cfg


def limits(block_size=4, max_model_len=64):
    return EngineLimits(block_size=block_size, max_num_seqs=8, max_num_batched_tokens=64,
                        max_model_len=max_model_len, chunked_prefill=True)


def paged(num_blocks=8, block_size=4, prefix_caching=True, swap_blocks=0):
    return PagedAllocator(PagedConfig(prefix_caching=prefix_caching),
                          AllocatorContext(num_blocks, block_size, limits(block_size), num_swap_blocks=swap_blocks))


def seq(rid, tokens, max_tokens=4):
    return Sequence(Request(rid, tuple(tokens), max_tokens))


def compute_all(alloc, s):
    """Allocate and 'compute' every known token of ``s`` (what a scheduled step does)."""
    assert alloc.allocate_slots(s, s.num_uncomputed_tokens)
    s.num_computed_tokens = s.num_tokens
    alloc.on_tokens_computed(s)


# ---- paged ---------------------------------------------------------------------------------
def test_paged_allocates_whole_blocks_all_or_nothing():
    alloc = paged(num_blocks=3, prefix_caching=False)
    a = seq("a", range(9))  # 3 blocks of 4
    assert alloc.allocate_slots(a, 9)
    assert len(alloc.block_table("a")) == 3 and alloc.num_free_blocks() == 0
    b = seq("b", range(2))
    assert not alloc.allocate_slots(b, 2)
    assert alloc.block_table("b") == [] and alloc.num_free_blocks() == 0
    alloc.free(a)
    alloc.free(a)  # idempotent
    assert alloc.num_free_blocks() == 3 and alloc.leaked_blocks() == 0


def test_prefix_hit_reuses_full_blocks_and_shares_ref_counts():
    alloc = paged()
    a = seq("a", list(range(10)))
    compute_all(alloc, a)  # blocks [0..3] [4..7] full -> hashed; [8, 9] partial
    b = seq("b", list(range(8)) + [99, 98, 97])
    assert alloc.admit(b) == 8
    assert alloc.block_table("b") == alloc.block_table("a")[:2]
    shared = alloc.block_table("a")[:2]
    assert [alloc.ref_counts[x] for x in shared] == [2, 2]
    b.num_computed_tokens = 8  # what the scheduler does with admit()'s answer
    assert alloc.allocate_slots(b, 3)
    assert alloc.block_table("b")[2] not in alloc.block_table("a")  # the rest is private
    alloc.free(a)
    assert [alloc.ref_counts[x] for x in shared] == [1, 1]
    alloc.free(b)
    assert alloc.leaked_blocks() == 0


def test_last_prompt_token_is_always_computed():
    alloc = paged()
    a = seq("a", range(8))
    compute_all(alloc, a)
    alloc.free(a)
    again = seq("again", range(8))  # identical prompt, exactly two full blocks
    assert alloc.admit(again) == 4  # only the first block: token 7 must be computed to sample


def test_partial_blocks_are_never_shared():
    alloc = paged()
    a = seq("a", range(6))
    compute_all(alloc, a)
    b = seq("b", list(range(6)) + [50, 51])
    assert alloc.admit(b) == 4  # the block holding tokens 4, 5 was partial when computed


def test_chained_hash_needs_the_same_prefix():
    alloc = paged()
    a = seq("a", list(range(8)) + [1])
    compute_all(alloc, a)
    b = seq("b", [7, 7, 7, 7] + list(range(4, 8)) + [1])  # same 2nd block, different 1st
    assert alloc.admit(b) == 0


def test_prefix_caching_off_never_hits():
    alloc = paged(prefix_caching=False)
    a = seq("a", range(9))
    compute_all(alloc, a)
    assert alloc.admit(seq("b", range(9))) == 0


def test_free_blocks_without_hash_are_reused_before_cached_ones():
    alloc = paged(num_blocks=4)
    a = seq("a", range(9))  # 2 full (hashed) + 1 partial (plain)
    compute_all(alloc, a)
    cached_blocks = alloc.block_table("a")[:2]
    alloc.free(a)
    assert alloc.num_free_blocks() == 4  # cached blocks still count as free
    b = seq("b", [500, 501])
    assert alloc.allocate_slots(b, 2)
    assert alloc.block_table("b")[0] not in cached_blocks
    assert alloc.admit(seq("c", range(9))) == 8  # both cached blocks survived


def test_evicts_least_recently_used_cached_block_first():
    alloc = paged(num_blocks=4)
    a, b = seq("a", list(range(4)) + [0]), seq("b", list(range(100, 104)) + [0])
    compute_all(alloc, a)
    compute_all(alloc, b)
    alloc.free(a)  # a's block becomes the oldest cached one
    alloc.free(b)
    filler = seq("f", range(200, 212))  # 3 blocks: 2 plain + 1 evicted
    assert alloc.allocate_slots(filler, 12)
    assert alloc.admit(seq("a2", list(range(4)) + [1])) == 0  # a's block was evicted
    assert alloc.admit(seq("b2", list(range(100, 104)) + [1])) == 4  # b's survived


def test_usage_stats_waste_is_unused_slots_over_allocated():
    alloc = paged(prefix_caching=False)
    a = seq("a", range(5))  # 2 blocks = 8 slots, 5 used
    assert alloc.allocate_slots(a, 5)
    assert alloc.usage_stats()["kv_waste_fraction"] == pytest.approx(3 / 8)


def test_usage_stats_follow_every_table_change():
    """The waste gauge is kept as running counts: they must equal a recount after admits (prefix
    hits), growth, swaps and frees in any order."""
    import random

    rng, alloc = random.Random(0), paged(num_blocks=24, swap_blocks=12)
    live, swapped = {}, {}
    for i in range(400):
        op = rng.random()
        if op < 0.3 and len(live) + len(swapped) < 6:
            s = seq(f"s{i}", [rng.randrange(3) for _ in range(rng.randrange(2, 14))])
            s.num_computed_tokens = alloc.admit(s)
            if alloc.allocate_slots(s, s.num_uncomputed_tokens):
                s.num_computed_tokens = s.num_tokens
                alloc.on_tokens_computed(s)
                live[s.id] = s
            else:
                alloc.free(s)
        elif op < 0.6 and live:
            s = rng.choice(list(live.values()))
            s.append_token(1, 0.0)
            if alloc.allocate_slots(s, 1):
                s.num_computed_tokens += 1
                alloc.on_tokens_computed(s)
        elif op < 0.7 and live:
            s = live[rng.choice(list(live))]
            if alloc.can_swap_out(s):
                alloc.swap_out(s)
                swapped[s.id] = live.pop(s.id)
        elif op < 0.8 and swapped:
            s = swapped[rng.choice(list(swapped))]
            if alloc.can_swap_in(s):
                alloc.swap_in(s)
                live[s.id] = swapped.pop(s.id)
        elif live or swapped:
            pool = live if live and (not swapped or rng.random() < 0.5) else swapped
            alloc.free(pool.pop(rng.choice(list(pool))))
        allocated = sum(len(t) for t in alloc.tables.values()) * alloc.block_size
        used = sum(alloc.slots_used.get(k, 0) for k in alloc.tables)
        assert alloc.usage_stats()["kv_waste_fraction"] == pytest.approx(1 - used / allocated if allocated else 0.0)
    for s in [*live.values(), *swapped.values()]:
        alloc.free(s)
    assert alloc.leaked_blocks() == 0 and alloc.usage_stats()["kv_waste_fraction"] == 0.0


# ---- swap ----------------------------------------------------------------------------------
def test_swap_out_and_in_moves_blocks_through_the_host_pool():
    alloc = paged(num_blocks=4, swap_blocks=3)
    a = seq("a", range(9))
    compute_all(alloc, a)
    device = alloc.block_table("a")
    assert alloc.can_swap_out(a)
    out = alloc.swap_out(a)
    assert [d for d, _ in out] == device and len({h for _, h in out}) == 3
    assert alloc.block_table("a") == [] and alloc.num_free_blocks() == 4
    assert alloc.leaked_blocks() == 3  # held on the host
    assert alloc.can_swap_in(a)
    back = alloc.swap_in(a)
    assert [h for h, _ in back] == [h for _, h in out]
    assert [d for _, d in back] == alloc.block_table("a")
    alloc.free(a)
    assert alloc.leaked_blocks() == 0


def test_swap_needs_room_in_the_host_pool():
    alloc = paged(num_blocks=4, swap_blocks=2)
    a = seq("a", range(9))  # 3 blocks > 2 host blocks
    compute_all(alloc, a)
    assert not alloc.can_swap_out(a)
    assert not paged(swap_blocks=0).can_swap_out(a)


def test_free_of_a_swapped_sequence_releases_its_host_blocks():
    alloc = paged(num_blocks=4, swap_blocks=4)
    a = seq("a", range(5))
    compute_all(alloc, a)
    alloc.swap_out(a)
    alloc.free(a)
    assert alloc.leaked_blocks() == 0 and not alloc.can_swap_in(a)


# ---- contiguous ----------------------------------------------------------------------------
def contiguous(num_blocks=10, block_size=4, reserve=ReserveFor.max_tokens, max_model_len=64):
    return ContiguousAllocator(ContiguousConfig(reserve=reserve),
                               AllocatorContext(num_blocks, block_size, limits(block_size, max_model_len)))


def test_contiguous_reserves_prompt_plus_max_tokens_up_front():
    alloc = contiguous()
    a = seq("a", range(5), max_tokens=6)  # 11 tokens -> 3 blocks
    assert alloc.allocate_slots(a, 5)
    assert alloc.block_table("a") == [0, 1, 2]
    assert alloc.usage_stats()["kv_waste_fraction"] == pytest.approx(1 - 5 / 12)
    a.num_computed_tokens = 5
    assert alloc.allocate_slots(a, 6)  # growth stays inside the reservation
    assert alloc.block_table("a") == [0, 1, 2] and alloc.num_free_blocks() == 7


def test_contiguous_first_fit_and_external_fragmentation():
    alloc = contiguous(num_blocks=10)
    seqs = [seq(f"s{i}", range(4), max_tokens=4) for i in range(5)]  # 2 blocks each
    for s in seqs:
        assert alloc.allocate_slots(s, 4)
    alloc.free(seqs[1])
    alloc.free(seqs[3])  # free runs: [2, 3], [6, 7]
    assert alloc.num_free_blocks() == 4
    assert alloc.usage_stats()["kv_external_fragmentation"] == pytest.approx(0.5)
    big = seq("big", range(8), max_tokens=4)  # 3 blocks: 4 free, none contiguous
    assert not alloc.allocate_slots(big, 8)
    small = seq("small", range(2), max_tokens=2)  # 1 block: first fit takes block 2
    assert alloc.allocate_slots(small, 2) and alloc.block_table("small") == [2]
    alloc.free(seqs[2])  # merges 3..7 into one run
    assert alloc.allocate_slots(big, 8) and alloc.block_table("big") == [3, 4, 5]
    for s in [seqs[0], seqs[4], small, big]:
        alloc.free(s)
    assert alloc.free_runs == [(0, 10)] and alloc.leaked_blocks() == 0


def test_contiguous_max_model_len_reservation_wastes_the_unused_context():
    alloc = contiguous(num_blocks=16, reserve=ReserveFor.max_model_len, max_model_len=32)
    a = seq("a", range(4), max_tokens=4)
    assert alloc.allocate_slots(a, 4)
    assert len(alloc.block_table("a")) == 8
    assert alloc.usage_stats()["kv_waste_fraction"] == pytest.approx(1 - 4 / 32)
    assert alloc.can_ever_fit(4) and not contiguous(num_blocks=4, reserve=ReserveFor.max_model_len,
                                                     max_model_len=32).can_ever_fit(4)


def test_contiguous_rejects_prefix_caching_naming_the_key():
    with pytest.raises(ConfigError, match="allocator.prefix_caching"):
        ContiguousAllocator(ContiguousConfig(prefix_caching=True), AllocatorContext(8, 4, limits()))


# ---- bad input -----------------------------------------------------------------------------
@pytest.mark.parametrize("overrides, key", [
    (["block_size=3"], "block_size"),
    (["block_size=0"], "block_size"),
    (["block_size=512"], "block_size"),
    (["backend.num_swap_blocks=-1"], "backend.num_swap_blocks"),
    (["backend.swap_space_gb=-0.5"], "backend.swap_space_gb"),
    (["backend.swap_space_gb=1", "backend.num_swap_blocks=4"], "backend.swap_space_gb"),
    (["backend.swap_bandwidth_gb_s=0"], "backend.swap_bandwidth_gb_s"),
])
def test_bad_memory_keys_name_the_key(overrides, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        validate(_cfg(tuple(overrides)))


@pytest.mark.parametrize("block_size", [1, 2, 4, 16, 256])
def test_power_of_two_block_sizes_are_accepted(block_size):
    validate(_cfg((f"block_size={block_size}", "max_num_batched_tokens=2048")))
