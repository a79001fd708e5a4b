"""Prefix-cache evictors (``evictor=<name>``): each built-in's policy on hand-made event sequences,
every evictor driven by random streams through the real paged allocator (only evictable blocks go,
nothing leaks, ref counts agree), the same output tokens as ``lru`` on the tiny model with a pool that
evicts, the simulator, config errors, and the allocator's checks of a broken evictor."""

from __future__ import annotations

import json
import random
import sys
from collections import Counter

import pytest

from conftest import compose
from servelab.plugin_api import AllocatorContext, hookimpl
from servelab.testing import registry_with
from servelab.core.cost_model import StepCostModel, StepFeatures
from servelab.core.interfaces import CachedBlock, EngineLimits, EvictorContext, EvictorError
from servelab.core.registry import default_registry
from servelab.core.request import Request, Sequence
from servelab.plugins.allocators.paged import PagedAllocator, PagedConfig
from servelab.plugins.evictors.arc import ArcEvictor
from servelab.plugins.evictors.cost_aware import CostAwareConfig, CostAwareEvictor
from servelab.plugins.evictors.lfu import LfuConfig, LfuEvictor
from servelab.plugins.evictors.lru import LruEvictor
from servelab.run.session import run_job
from servelab.assemble.executor import build_executor
from servelab.assemble.stack import build_stack
from servelab.workloads.build import build_requests

EVICTORS = default_registry().names("evictor")
ROOT = b""


def context(num_blocks: int = 16, block_size: int = 4, cost_model=None) -> EvictorContext:
    return EvictorContext(num_blocks, block_size, cost_model or StepCostModel())


def entry(block: int, digest: bytes, parent: bytes = ROOT, position: int = 0) -> CachedBlock:
    return CachedBlock(block, digest, parent, position)


def use(ev, block: int, digest: bytes, hits: int = 0, parent: bytes = ROOT, position: int = 0) -> None:
    """Insert ``block``, hit it ``hits`` times, release it (a request computed, shared, finished it)."""
    ev.on_insert(entry(block, digest, parent, position))
    for _ in range(hits):
        ev.on_hit(block)
    ev.on_release(block)


def drain(ev) -> list[int]:
    out = []
    while (block := ev.evict()) is not None:
        out.append(block)
    return out


# ---- lfu -------------------------------------------------------------------------------------
def test_lfu_keeps_a_hot_block_over_a_newer_cold_one():
    ev = LfuEvictor(LfuConfig(half_life=1000), context())
    use(ev, 0, b"hot", hits=3)
    use(ev, 1, b"cold")
    assert drain(ev) == [1, 0]


def test_lfu_lets_an_old_hot_block_leave_with_a_short_half_life():
    def order(half_life):
        ev = LfuEvictor(LfuConfig(half_life=half_life), context())
        use(ev, 0, b"hot", hits=3)
        for b in range(1, 6):  # 10 more ticks of cold traffic: the hot count halves 10 times at half_life=1
            use(ev, b, bytes([b]))
        return drain(ev)

    assert order(1000) == [1, 2, 3, 4, 5, 0]
    assert order(1)[0] == 0


def test_lfu_hit_takes_a_block_out_of_the_candidates():
    ev = LfuEvictor(LfuConfig(), context())
    use(ev, 0, b"a")
    use(ev, 1, b"b", hits=5)
    ev.on_hit(0)  # reused: referenced again
    assert drain(ev) == [1]
    ev.on_release(0)
    assert drain(ev) == [0]


def test_lfu_heap_stays_bounded_under_hits_of_evictable_blocks():
    ev = LfuEvictor(LfuConfig(), context(num_blocks=4))
    for b in range(4):
        use(ev, b, bytes([b]))
    for _ in range(5000):  # stale heap entries: each hit of an evictable block leaves one
        for b in range(4):
            ev.on_hit(b)
            ev.on_release(b)
    assert len(ev.heap.entries) <= 2 * 4 + 64 + 1
    assert sorted(drain(ev)) == [0, 1, 2, 3]


# ---- arc -------------------------------------------------------------------------------------
def test_arc_a_one_time_scan_does_not_flush_blocks_used_twice():
    ev = ArcEvictor(ArcEvictor.Config(), context(num_blocks=4))
    use(ev, 0, b"keep0", hits=1)  # inserted and hit: T2
    use(ev, 1, b"keep1", hits=1)
    use(ev, 2, b"scan0")
    use(ev, 3, b"scan1")
    for i in range(2, 12):  # a scan: each new block used once, in the slot just given up
        victim = ev.evict()
        assert victim in (2, 3)
        use(ev, victim, b"scan%d" % i)
    lru = LruEvictor(LruEvictor.Config(), context(num_blocks=4))
    use(lru, 0, b"keep0", hits=1)
    use(lru, 1, b"keep1", hits=1)
    use(lru, 2, b"scan0")
    assert lru.evict() == 0  # the contrast: recency alone lets the scan flush them


def test_arc_ghost_hits_move_the_target():
    ev = ArcEvictor(ArcEvictor.Config(), context(num_blocks=4))
    use(ev, 0, b"once")
    use(ev, 1, b"twice", hits=1)
    assert ev.evict() == 0 and ev.p == 0  # |T1| = 1 > p = 0: T1's block goes, its digest to B1
    use(ev, 0, b"once")  # recomputed: a B1 ghost, T1 was too small
    assert ev.p == 1 and ev.where[0] == 2
    assert ev.evict() == 1  # |T1| = 0 <= p: T2's least recently released block goes, to B2
    use(ev, 1, b"twice")  # a B2 ghost: T2 was too small
    assert ev.p == 0 and ev.where[1] == 2


def test_arc_takes_from_t2_when_t1_has_nothing_evictable():
    ev = ArcEvictor(ArcEvictor.Config(), context(num_blocks=4))
    ev.on_insert(entry(0, b"busy"))  # T1, referenced
    use(ev, 1, b"t2", hits=1)
    assert ev.evict() == 1 and ev.evict() is None


# ---- cost_aware ------------------------------------------------------------------------------
class Coefficients:
    """A cost model with fixed coefficients: 0.1 ms per prefill token, 1 ms per 1000 attended tokens."""

    def coefficient_vector(self):
        return 0.0, 1e-4, 0.0, 1e-3


def cost_aware(**config) -> CostAwareEvictor:
    config.setdefault("half_life", 1e9)  # equal reuse: decay negligible over a test's ticks
    return CostAwareEvictor(CostAwareConfig(**config), context(block_size=4, cost_model=Coefficients()))


def test_cost_aware_evicts_a_leaf_before_its_parent():
    ev = cost_aware(cost_exponent=0.0)  # even where the parent alone would go first (older, equal uses)
    ev.on_insert(entry(0, b"A"))
    ev.on_insert(entry(1, b"B", parent=b"A", position=1))
    ev.on_release(0)  # released first
    ev.on_release(1)
    assert drain(ev) == [1, 0]


def test_cost_aware_a_cheap_shallow_block_goes_before_a_deep_expensive_one():
    def first(cost_exponent):
        ev = cost_aware(cost_exponent=cost_exponent)
        use(ev, 0, b"deep", parent=b"elsewhere", position=40)  # used and released first
        use(ev, 1, b"shallow", position=0)
        return ev.evict()

    assert first(1.0) == 1
    assert first(0.0) == 0  # without the cost term it is a decayed LFU: the older use goes


def test_cost_aware_reuse_outweighs_a_small_cost_difference():
    ev = cost_aware()
    use(ev, 0, b"hot", hits=9, position=0)
    use(ev, 1, b"cold", parent=b"x", position=1)
    assert ev.evict() == 1


def test_cost_aware_an_inner_block_goes_when_no_leaf_is_evictable():
    ev = cost_aware()
    ev.on_insert(entry(0, b"A"))
    ev.on_insert(entry(1, b"B", parent=b"A", position=1))  # stays referenced
    ev.on_release(0)
    assert ev.evict() == 0
    ev.on_release(1)
    assert ev.evict() == 1


def test_cost_aware_a_parent_becomes_a_leaf_again_and_a_new_child_makes_it_inner():
    ev = cost_aware(cost_exponent=0.0)
    use(ev, 0, b"A")
    use(ev, 1, b"B", parent=b"A", position=1)
    use(ev, 2, b"C")  # an unrelated leaf, released last
    assert ev.evict() == 1  # the oldest leaf
    assert ev.evict() == 0  # A is a leaf now and older than C
    use(ev, 0, b"A")
    ev.on_insert(entry(1, b"B2", parent=b"A", position=1))  # A gets a (referenced) child: inner again
    assert ev.evict() == 2 and ev.evict() == 0


class Rescaled(Coefficients):
    """The coefficients times ``scale``: a cost model whose fit changed the overall speed only."""

    scale = 100.0

    def coefficient_vector(self):
        return tuple(self.scale * c for c in super().coefficient_vector())


def test_cost_aware_keys_compare_across_a_refit_of_the_cost_models_scale():
    model = Rescaled()
    ev = CostAwareEvictor(CostAwareConfig(half_life=1e9), context(block_size=4, cost_model=model))
    use(ev, 0, b"early", position=3)  # released while the model (say its prior) prices tokens 100x dearer
    model.scale = 1.0
    use(ev, 1, b"late", position=3)
    assert ev.evict() == 0  # equal relative cost and uses: the older goes, as if nothing had been refitted


def test_cost_aware_prices_a_block_as_the_cost_model_prices_its_recompute():
    model = StepCostModel()
    for n in (64, 128, 256, 512, 1024, 64, 300):  # prefill steps: time grows with tokens and attention
        for _ in range(3):
            model.observe(StepFeatures(prefill_tokens=n, attended_context=n * (n + 1) // 2), 1e-4 * n + 2e-9 * n * n)
    ev = CostAwareEvictor(CostAwareConfig(), context(block_size=16, cost_model=model))
    assert model.coefficient_vector()[3] > 0
    for k in (0, 1, 7):
        expected = model.recompute_seconds(16 * (k + 1)) - model.recompute_seconds(16 * k)
        assert ev.recompute_cost(k) == pytest.approx(expected, rel=1e-9)
        assert ev.relative_cost(k) == pytest.approx(ev.recompute_cost(k) / ev.recompute_cost(0), rel=1e-9)
    assert ev.recompute_cost(7) > ev.recompute_cost(0)


# ---- config errors ---------------------------------------------------------------------------
@pytest.mark.parametrize("cls, config, message", [
    (LfuEvictor, LfuConfig(half_life=0), "evictor.half_life=0 must be > 0"),
    (LfuEvictor, LfuConfig(half_life=-3.5), "evictor.half_life=-3.5 must be > 0"),
    (CostAwareEvictor, CostAwareConfig(half_life=0.0), "evictor.half_life=0 must be > 0"),
    (CostAwareEvictor, CostAwareConfig(cost_exponent=-1), "evictor.cost_exponent=-1 must be >= 0"),
])
def test_out_of_range_config_is_one_line_naming_the_key(cls, config, message):
    with pytest.raises(ValueError, match=f"^{message}$"):
        cls(config, context())


def test_out_of_range_config_fails_the_build_naming_the_key():
    cfg = compose("backend=sim", "allocator.prefix_caching=true", "evictor=lfu", "evictor.half_life=0")
    with pytest.raises(ValueError, match="evictor.half_life=0 must be > 0"):
        build_stack(cfg)


# ---- random streams through the real allocator -----------------------------------------------
def limits(block_size: int) -> EngineLimits:
    return EngineLimits(block_size=block_size, max_num_seqs=8, max_num_batched_tokens=64, max_model_len=64,
                        chunked_prefill=True)


def check_allocator(alloc: PagedAllocator) -> None:
    """Ref counts equal table occurrences; every block is exactly one of referenced, evictable
    (cached, unreferenced) or plain free; the digest map and the blocks agree."""
    refs = Counter(b for table in alloc.tables.values() for b in table)
    n = alloc.num_blocks
    assert alloc.ref_counts == [refs.get(b, 0) for b in range(n)]
    cached = {b for b in range(n) if alloc.block_hash[b] is not None}
    assert alloc.evictable == {b for b in cached if not refs[b]}
    assert sorted(alloc.free_plain) == sorted(b for b in range(n) if b not in cached and not refs[b])
    assert {d: b for d, b in alloc.cached.items()} == {alloc.block_hash[b]: b for b in cached}


def drive(name: str, seed: int, num_blocks: int = 12, block_size: int = 2, actions: int = 250) -> int:
    """Random admits, chunks, finishes, swaps through a small pool; returns how many evictions happened."""
    rng = random.Random(seed)
    cls = default_registry().get("evictor", name)
    evictor = cls(cls.Config(), EvictorContext(num_blocks, block_size, StepCostModel()))
    evictions = []
    choose = evictor.evict

    def checked_evict():
        block = choose()
        assert block in alloc.evictable, f"{name} chose {block}, not evictable"
        evictions.append(block)
        return block

    evictor.evict = checked_evict  # before the allocator is built: it may bind the evictor's methods
    alloc = PagedAllocator(PagedConfig(prefix_caching=True),
                           AllocatorContext(num_blocks, block_size, limits(block_size), evictor, num_swap_blocks=6))
    bases = [[rng.randrange(50) for _ in range(14)] for _ in range(3)]
    live: dict[str, Sequence] = {}
    swapped: dict[str, Sequence] = {}

    def compute(s: Sequence) -> bool:
        if not s.num_uncomputed_tokens:
            return True
        n = rng.randint(1, s.num_uncomputed_tokens)
        if not alloc.allocate_slots(s, n):
            return False
        s.num_computed_tokens += n
        alloc.on_tokens_computed(s)
        return True

    for i in range(actions):
        action = rng.random()
        if action < 0.3 and len(live) + len(swapped) < 4:
            base = rng.choice(bases)
            tokens = base[:rng.randint(0, len(base))] + [rng.randrange(50) for _ in range(rng.randint(1, 6))]
            s = Sequence(Request(f"s{i}", tuple(tokens), 4))
            s.num_computed_tokens = alloc.admit(s)
            if compute(s):
                live[s.id] = s
            else:
                alloc.free(s)
        elif action < 0.6 and live:
            s = live[rng.choice(sorted(live))]
            if not compute(s):
                alloc.free(s)
                del live[s.id]
        elif action < 0.8 and live:
            alloc.free(live.pop(rng.choice(sorted(live))))
        elif action < 0.9 and live:
            s = live[rng.choice(sorted(live))]
            if alloc.can_swap_out(s):
                alloc.swap_out(s)
                swapped[s.id] = live.pop(s.id)
        elif swapped:
            s = swapped[rng.choice(sorted(swapped))]
            if rng.random() < 0.3:
                alloc.free(swapped.pop(s.id))
            elif alloc.can_swap_in(s):
                alloc.swap_in(s)
                live[s.id] = swapped.pop(s.id)
        check_allocator(alloc)
    for s in [*live.values(), *swapped.values()]:
        alloc.free(s)
    check_allocator(alloc)
    assert alloc.leaked_blocks() == 0 and alloc.num_free_blocks() == num_blocks
    # The evictor still knows every evictable block: a request of the whole pool evicts them all.
    cached = len(alloc.evictable)
    whole = Sequence(Request("whole", tuple(range(1000, 1000 + num_blocks * block_size)), 1))
    assert alloc.allocate_slots(whole, num_blocks * block_size)
    assert len(evictions) >= cached and not alloc.evictable
    alloc.free(whole)
    assert alloc.leaked_blocks() == 0
    return len(evictions)


@pytest.mark.parametrize("name", EVICTORS)
def test_random_streams_through_the_paged_allocator(name):
    assert sum(drive(name, seed) for seed in range(6)) > 50


# ---- whole runs ------------------------------------------------------------------------------
TRACE = ("model=tiny", "workload=hash_ids", "workload.path=mooncake_conv", "workload.block_tokens=8",
         "workload.seed=0", "block_size=8", "allocator.prefix_caching=true", "clock=virtual",
         "time_model=profile_small64", "model.hidden_size=64", "model.intermediate_size=128",
         "model.num_hidden_layers=2", "model.num_attention_heads=4", "model.num_key_value_heads=2",
         "max_model_len=2048", "backend.num_threads=1")


def counting_evictions(stack) -> list[int]:
    """Count the run's evictions (the allocator asks the evictor only when it must give one up)."""
    count = [0]
    evictor = stack.engine.allocator.evictor
    choose = evictor.evict

    def counted():
        count[0] += 1
        return choose()

    evictor.evict = counted
    return count


def run_trace(cfg, executor, requests, out):
    stack = build_stack(cfg, executor=executor)
    evictions = counting_evictions(stack)
    result = run_job(cfg, out, requests=requests, stack=stack)
    records = [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]
    return result.summary, {r["id"]: r["output_token_ids"] for r in records}, evictions[0]


def test_every_evictor_gives_lru_tokens_on_the_tiny_model(tmp_path):
    """Which blocks stay cached changes what is recomputed, never what is computed: with a pool that
    evicts, every evictor's greedy tokens are lru's."""
    overrides = TRACE + ("workload.num_requests=30", "workload.output_scale=0.05", "num_kv_blocks=180")
    cfg = compose(*overrides)
    executor = build_executor(cfg)
    try:
        requests = build_requests(cfg.workload, executor.spec.vocab_size, cfg.max_model_len, None)
        outputs = {}
        for name in sorted(EVICTORS, key=lambda n: n != "lru"):  # lru first: the reference
            summary, outputs[name], evictions = run_trace(compose(*overrides, f"evictor={name}"), executor,
                                                          requests, tmp_path / name)
            assert summary["status"] == "completed" and summary["leaked_blocks"] == 0, name
            assert evictions > 0 and summary["prefix_cache_hit_rate"] > 0, name
            assert outputs[name] == outputs["lru"], name
        assert sum(len(t) for t in outputs["lru"].values()) > len(requests)  # several tokens each
    finally:
        executor.shutdown()


@pytest.mark.parametrize("name", EVICTORS)
def test_simulated_runs_finish_without_leaks(tmp_path, name):
    cfg = compose(*TRACE, "backend=sim", "workload.num_requests=80", "num_kv_blocks=200", f"evictor={name}")
    summary, _, evictions = run_trace(cfg, None, None, tmp_path)
    assert summary["status"] == "completed" and summary["leaked_blocks"] == 0
    assert summary["num_requests"] == 80 and evictions > 0


# ---- broken evictors -------------------------------------------------------------------------
class ReturnsReferenced(LruEvictor):
    name = "returns_referenced"

    def evict(self):
        return 0


class ReturnsUncached(LruEvictor):
    name = "returns_uncached"

    def evict(self):
        return 3


class ReturnsNone(LruEvictor):
    name = "returns_none"

    def evict(self):
        return None


class RaisesInEvict(LruEvictor):
    name = "raises_in_evict"

    def evict(self):
        raise RuntimeError("no victim today")


class RaisesOnRelease(LruEvictor):
    name = "raises_on_release"

    def on_release(self, block):
        raise KeyError(block)


def squeezed(evictor_cls) -> tuple[PagedAllocator, Sequence]:
    """4 blocks of 2: blocks 0 and 1 cached and free, block 0 reused by a live request; block 2, 3
    plain. The returned request needs 3 blocks, so the allocator must evict one (block 1)."""
    evictor = evictor_cls(evictor_cls.Config(), EvictorContext(4, 2, StepCostModel()))
    alloc = PagedAllocator(PagedConfig(prefix_caching=True), AllocatorContext(4, 2, limits(2), evictor))
    a = Sequence(Request("a", (1, 2, 3, 4, 5), 1))
    assert alloc.allocate_slots(a, 5)
    a.num_computed_tokens = 5
    alloc.on_tokens_computed(a)
    alloc.free(a)
    keep = Sequence(Request("keep", (1, 2, 8), 1))
    assert alloc.admit(keep) == 2 and alloc.block_table("keep") == [0]
    return alloc, Sequence(Request("b", (6,) * 5, 1))


@pytest.mark.parametrize("cls, message", [
    (ReturnsReferenced, "evictor plugin 'returns_referenced' returned block 0, which 1 running request"),
    (ReturnsUncached, "evictor plugin 'returns_uncached' returned block 3, which is not a cached block"),
    (ReturnsNone, "evictor plugin 'returns_none' returned no block while 1 cached blocks are evictable"),
    (RaisesInEvict, r"evictor plugin 'raises_in_evict' raised RuntimeError in evict\(\): no victim today"),
])
def test_the_allocator_stops_a_bad_eviction_naming_the_evictor_and_the_block(cls, message):
    alloc, b = squeezed(cls)
    assert squeezed(LruEvictor)[0].allocate_slots(b, 5)  # the scenario itself is sound
    with pytest.raises(EvictorError, match=message):
        alloc.allocate_slots(b, 5)


def test_an_evictor_raising_on_an_event_is_named_with_the_block():
    with pytest.raises(EvictorError, match=r"'raises_on_release' raised KeyError in on_release\(1\)"):
        squeezed(RaisesOnRelease)


class OutOfPool(LruEvictor):
    name = "out_of_pool"

    def evict(self):
        return 10**6


@hookimpl
def servelab_register_evictors():
    return [OutOfPool]


def test_a_run_with_a_bad_evictor_fails_naming_it_and_keeps_partial_results(tmp_path):
    registry = registry_with(sys.modules[__name__])
    cfg = compose(*TRACE, "backend=sim", "workload.num_requests=40", "num_kv_blocks=200", "evictor=out_of_pool")
    stack = build_stack(cfg, registry)
    with pytest.raises(Exception, match="evictor plugin 'out_of_pool' returned block 1000000, which is not a cached"):
        run_job(cfg, tmp_path, stack=stack)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"].startswith("failed") and "out_of_pool" in summary["status"]
    assert (tmp_path / "requests.jsonl").exists()
