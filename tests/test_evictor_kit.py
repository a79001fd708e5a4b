"""The plugin kit for evictors: ``servelab check-plugin evictor=<name>`` checks every answer of
``evict()`` (deliberately broken evictors are caught, the contract named), runs a fixed
shared-prefix workload through pools from large to thrashing (the ideal's hits where nothing need
be evicted, every block reusable at the end), and ``servelab grade evictor=<name>`` scores against
lru on a prefix cache that thrashes."""

from __future__ import annotations

from collections import OrderedDict

import pytest

from servelab.core.hookspecs import hookimpl
from servelab.core.interfaces import Evictor
from servelab.core.registry import build_registry, default_registry
from servelab.core.request import Request
from servelab.kit import conformance
from servelab.kit.conformance_evictor import (LADDER_BLOCK_SIZE, _ScriptPool, event_script, ideal_cached_tokens, ladder,
                                              ladder_requests, victim_problem)
from servelab.kit.grade_workloads import WORKLOADS, prefix_thrash, workloads_for
from servelab.kit.grading import grade, score_of, to_markdown
from servelab.testing import check_plugin, servelab_plugin_manager
from servelab.plugins.allocators.paged import PagedAllocator
from servelab.plugins.evictors.lru import LruEvictor
from servelab.config import register_configs


# ---- deliberately broken evictors (and allocators an evictor may be checked behind) -------------
class IgnoresHits(LruEvictor):
    """Keeps a reused block among its candidates: gives up blocks that requests hold."""

    name = "ignores_hits"

    def on_hit(self, block):
        pass


class NamesStrangers(LruEvictor):
    """Answers with a block outside the pool."""

    name = "names_strangers"

    def evict(self):
        super().evict()
        return self.context.num_blocks


class Forgetful(LruEvictor):
    """Remembers two candidates at most: answers None while cached blocks are evictable."""

    name = "forgetful"

    def on_release(self, block):
        super().on_release(block)
        while len(self.queue) > 2:
            self.queue.popitem(last=False)


class Raises(LruEvictor):
    name = "raises"

    def on_release(self, block):
        raise KeyError(block)


class Mru(Evictor):
    """Most recently released first: gives up the prefixes just used (a bad policy, not a broken one)."""

    name = "mru"

    def __init__(self, config, context) -> None:
        super().__init__(config, context)
        self.queue: OrderedDict[int, None] = OrderedDict()

    def on_hit(self, block):
        self.queue.pop(block, None)

    def on_release(self, block):
        self.queue[block] = None

    def evict(self):
        return self.queue.popitem(last=True)[0]


class EagerPaged(PagedAllocator):
    """Evicts a cached block whenever one is evictable, though free blocks remain: loses hits."""

    name = "eager_paged"

    def _take_block(self):
        if self.evictable:
            self.free_plain.append(self._evict())  # taken next (the free blocks are a stack)
        return super()._take_block()


class Hoarding(PagedAllocator):
    """Never gives a released never-cached block back: the pool shrinks with every request."""

    name = "hoarding"

    def _release(self, block):
        super()._release(block)
        if self.free_plain and self.free_plain[-1] == block:
            self.free_plain.pop()


class _Plugins:
    @hookimpl
    def servelab_register_evictors(self):
        return [IgnoresHits, NamesStrangers, Forgetful, Raises, Mru]

    @hookimpl
    def servelab_register_allocators(self):
        return [EagerPaged, Hoarding]


@pytest.fixture(scope="module")
def registry():
    pm = servelab_plugin_manager()  # the built-in policies and executors
    pm.register(_Plugins())
    reg = build_registry(pm)
    register_configs(reg)
    return reg


# ---- check-plugin -------------------------------------------------------------------------
@pytest.mark.parametrize("name", default_registry().names("evictor"))
def test_every_builtin_evictor_passes(name):
    report = check_plugin("evictor", name, cases=3, real_model=False)
    assert report.ok, str(report)
    assert "allocator.prefix_caching=true" in str(report)


@pytest.mark.parametrize("name, contract, line", [
    ("ignores_hits", "live block kept", "evictor plugin 'ignores_hits': evict() returned block"),
    ("names_strangers", "victim is cached", "evict() returned 12, which is not a cached block"),
    ("forgetful", "victim given", "evict() returned None while"),
    ("raises", "plugin raised", "KeyError in on_release("),
])
def test_a_broken_evictor_fails_the_event_script_naming_the_contract(registry, name, contract, line):
    report = check_plugin("evictor", name, registry=registry, cases=5, real_model=False)
    assert report.contracts_broken == [contract], str(report)
    text = str(report)
    assert f"contract broken: {contract}" in text and line in text, text
    assert "event script seed 0" in text and "the last events:" in text  # how to replay it
    assert report.cases == 0  # stopped at the script: the cheapest, clearest account


@pytest.mark.parametrize("name, contract", [("ignores_hits", "live block kept"), ("forgetful", "victim given")])
def test_the_guard_catches_a_bad_answer_in_a_run_before_the_allocator_acts(registry, name, contract):
    failure = conformance._check_ladder(name, registry, ())
    assert failure is not None and failure.contract == contract, failure
    assert failure.message.startswith(f"evictor plugin '{name}': evict() returned") and "(step " in failure.message
    assert "the kit's fixed shared-prefix run" in failure.message


def test_a_random_scenario_puts_the_evictor_behind_prefix_caching_and_checks_it(registry):
    scenario = conformance.make_scenario(1, "evictor", "ignores_hits")
    assert {"allocator=paged", "allocator.prefix_caching=true", "evictor=ignores_hits"} <= set(scenario.overrides)
    failures = [conformance._check_scenario(conformance.make_scenario(s, "evictor", "ignores_hits"), registry, [],
                                            ("evictor", "ignores_hits")) for s in range(8)]
    assert {f.contract for f in failures if f is not None} == {"live block kept"}


def test_losing_hits_a_large_pool_keeps_is_caught(registry):
    report = check_plugin("evictor", "lru", registry=registry, cases=0, real_model=False,
                          overrides=("allocator=eager_paged",))
    assert report.contracts_broken == ["hits kept"], str(report)
    assert "an unbounded cache keeping every earlier prompt serves 448" in str(report)


def test_blocks_that_do_not_come_back_are_caught(registry):
    report = check_plugin("evictor", "lru", registry=registry, cases=0, real_model=False,
                          overrides=("allocator=hoarding",))
    assert report.contracts_broken == ["blocks reusable"], str(report)
    assert "evictor=lru (the run compared with): " not in str(report)  # the plugin's own run failed first
    assert "blocks are not free once every request ended" in str(report)


def test_victim_problem_names_each_bad_answer():
    pool = _ScriptPool(4, 0)
    pool.block_hash[1], pool.ref_counts[1] = b"x", 1
    pool.block_hash[2] = b"y"
    pool.evictable.add(2)
    assert victim_problem(2, pool) is None
    assert victim_problem(1, pool)[0] == "live block kept"
    assert victim_problem(0, pool)[0] == "victim is cached"
    assert victim_problem(9, pool)[0] == "victim is cached"
    assert victim_problem("2", pool)[0] == "victim is cached"
    assert victim_problem(None, pool) == ("victim given", "evict() returned None while 1 cached blocks are evictable")


def test_the_event_script_passes_lru_and_sends_every_kind_of_event():
    seen = []

    class Recording(LruEvictor):
        def __getattribute__(self, name):
            if name in ("on_insert", "on_hit", "on_release", "evict"):
                seen.append(name)
            return super().__getattribute__(name)

    evictor = Recording(LruEvictor.Config(), conformance_context(12))
    assert event_script(evictor, 0, 12) is None
    assert {"on_insert", "on_hit", "on_release", "evict"} <= set(seen) and seen.count("evict") > 20


def conformance_context(num_blocks):
    from servelab.core.cost_model import StepCostModel
    from servelab.core.interfaces import EvictorContext

    return EvictorContext(num_blocks, 4, StepCostModel())


def test_the_ideal_counts_leading_full_blocks_seen_before_never_the_last_token():
    a = Request("a", tuple(range(1, 10)), 1)  # 9 tokens: blocks [1-4], [5-8] seen
    b = Request("b", tuple(range(1, 9)), 1)  # the same 8 tokens: the last one is computed, so 1 block
    c = Request("c", tuple(range(1, 6)) + (99, 98, 97, 96, 95), 1)  # shares block 1 only
    assert ideal_cached_tokens([a, b, c], 4) == 0 + 4 + 4
    requests = ladder_requests()
    assert ideal_cached_tokens(requests, LADDER_BLOCK_SIZE) == 448
    assert all(r.prompt_len + r.max_tokens <= 64 for r in requests)


def test_the_ladder_runs_from_no_eviction_to_thrashing():
    registry = default_registry()
    register_configs(registry)
    hit_rates = {}
    for label, overrides, num_blocks in ladder():
        _, result = conformance._run((*overrides, "evictor=lru"), num_blocks, 0, ladder_requests(), registry,
                                     checked=True)
        hit_rates[label] = result.summary["prefix_cache_hit_rate"]
    labels = [label for label, _, _ in ladder()]
    assert labels == ["large pool, one request at a time", "large pool", "half the cache", "thrashing"]
    hit = [hit_rates[label] for label in labels]
    assert hit[0] > hit[1] >= hit[2] > hit[3] > 0  # the thrashing pool loses hits: eviction happened


# ---- grade --------------------------------------------------------------------------------
def test_the_eviction_workload_grades_evictors_only():
    assert [w.name for w in workloads_for("evictor")] == ["prefix_thrash"]
    assert "prefix_thrash" not in [w.name for w in workloads_for("scheduler")]
    assert [w.name for w in WORKLOADS][:4] == ["chat_burst", "long_prompts", "tight_pool", "fairness_flood"]
    requests = prefix_thrash()
    assert len(requests) == 696 and ideal_cached_tokens(requests, 16) / sum(r.prompt_len for r in requests) > 0.7
    assert requests == sorted(requests, key=lambda r: r.arrival_time)


def test_an_evictor_scores_hit_rate_and_goodput_against_lru():
    from servelab.kit.grading import Row

    def row(goodput, hit):
        return Row("w", "p", 1, 1, 1.0, None, None, None, None, None, 0, goodput, prefix_hit_rate=hit)

    assert score_of("evictor", row(2.0, 0.5), row(2.0, 0.5)) == 1.0
    assert score_of("evictor", row(1.0, 0.8), row(2.0, 0.2)) == pytest.approx(2 ** 0.5)
    assert score_of("evictor", row(1.0, 0.8), row(2.0, 0.0)) is None
    assert score_of("scheduler", row(1.0, 0.8), row(2.0, 0.2)) == 0.5


@pytest.mark.slow
def test_grade_scores_lru_one_against_itself_and_a_bad_evictor_below(registry):
    g = grade("evictor", "mru", registry=registry)
    rows = {r.policy: r for r in g.rows}
    assert list(rows)[0] == "mru" and set(rows) == {"mru", *default_registry().names("evictor")}
    assert rows["lru"].score == 1.0
    assert g.score == rows["mru"].score < 1.0
    assert rows["mru"].prefix_hit_rate < rows["lru"].prefix_hit_rate
    assert all(r.finished == r.requests == 696 for r in g.rows)
    md = to_markdown([g])
    assert md.startswith("## evictor=mru: score") and "prefix hit rate and goodput vs lru, on prefix_thrash" in md
    assert "| prefix hit | score |" in md
