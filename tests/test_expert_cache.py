"""The expert_cache kind: none (the default, nothing priced, every result as before), lru, lfu, prefetch
(experts offloaded to host memory, misses and prefetches priced over the host link), the memory plan
giving the offloaded bytes to the KV pool, one-line refusals, its kit and new-plugin."""

from __future__ import annotations

import sys
import tempfile

import numpy as np
import pytest

from conftest import compose
from servelab.assemble.stack import build_stack
from servelab.core.errors import ConfigError
from servelab.core.expert_cache import ExpertCacheContext, check_mask, top_slots
from servelab.core.shapes import HardwareProfile
from servelab.kit.conformance import Failure
from servelab.kit.conformance_expert_cache import _check_layout
from servelab.plugins.expert_caches import LfuExpertCache, LruExpertCache, NoExpertCache, PrefetchExpertCache
from servelab.plugins.expert_caches.prefetch import PrefetchConfig
from servelab.run.session import run_job
from servelab.sim.moe_cache import CachedExperts

LINK = HardwareProfile("h100", 80, 3350, 989, 450, 1)  # a 1 GB/s host link: a 1 MB expert loads in 1 ms
MOE = ("backend=sim", "model=qwen3_30b_a3b", "hardware=h100", "sim.moe.routing_skew=1.2",
       "workload.num_requests=12", "workload.output_len.max=24")
MS = 1e-3


def context(experts=4, layers=2, ep=1, slots=2):
    return ExpertCacheContext(experts, layers, ep, experts // ep, slots)


def tokens(*rows):
    """``[layers, 1, experts]`` tokens from one list per layer."""
    return np.array(rows, dtype=np.int64)[:, None, :]


def test_top_slots_and_check_mask():
    score = np.array([[[3, 1, 3, 0]]])
    assert top_slots(score, 2)[0, 0].tolist() == [True, False, True, False]  # ties: the lower slot
    assert top_slots(score, 2, allowed=score < 3)[0, 0].tolist() == [False, True, False, True]
    with pytest.raises(ConfigError, match="layer 0 of rank 0 keeps 3 experts resident, over the cache's 2 slots"):
        check_mask(np.ones((1, 1, 4), bool) & [True, True, True, False], context(layers=1), "x")
    with pytest.raises(ConfigError, match="a bool mask of shape"):
        check_mask(np.ones((1, 1, 4)), context(layers=1), "x")


def test_lru_keeps_the_most_recent_lfu_the_most_used():
    c = context(layers=1)
    lru, lfu = LruExpertCache(None, c), LfuExpertCache(None, c)
    resident = lru.start()  # slots 0 and 1
    for step in (tokens([9, 0, 0, 0]), tokens([0, 0, 1, 0]), tokens([0, 0, 0, 1])):
        resident = lru.keep(resident, step)
    assert resident[0, 0].tolist() == [False, False, True, True]
    resident = lfu.start()
    for step in (tokens([9, 0, 0, 0]), tokens([0, 0, 1, 0]), tokens([0, 0, 0, 1])):
        resident = lfu.keep(resident, step)
    assert resident[0, 0].tolist() == [True, False, True, False]  # expert 0 (9 tokens), then a tie: the lower slot


def test_prefetch_guesses_a_layers_misses_one_layer_early_and_hides_them_behind_its_compute():
    c = context(experts=4, layers=2, slots=2)
    step = tokens([1, 0, 0, 0], [0, 0, 1, 0])  # layer 0 a hit, layer 1 a miss
    expert_s = np.array([2 * MS, 2 * MS])
    stalls = {}
    for recall in (0.0, 1.0):
        priced = CachedExperts(PrefetchExpertCache(PrefetchConfig(recall=recall), c), c, LINK, 1e6, lambda n: 0.5 * MS)
        stalls[recall] = priced.step(1, step, expert_s)
        assert (priced.hits, priced.misses) == (1, 1)
    # on demand: issued at layer 1's router (3 ms), 1 ms late; guessed at layer 0's router (0.5 ms): there at 1.5
    assert stalls == {0.0: pytest.approx(1 * MS), 1.0: 0.0}
    assert priced.guessed == priced.guessed_right == 1
    with pytest.raises(ConfigError, match="expert_cache.recall=1.5 must lie in"):
        PrefetchExpertCache(PrefetchConfig(recall=1.5), c)


def test_a_miss_stalls_its_layer_by_its_load_and_a_prefetch_early_enough_does_not():
    c = context(experts=4, layers=2, slots=2)
    priced = CachedExperts(LfuExpertCache(None, c), c, LINK, 1e6, lambda n: 0.5 * MS)
    expert_s = np.array([2 * MS, 2 * MS])
    # layer 0 routes to expert 2 (not resident: slots 0, 1 are): 1 ms load after its router, the layer waits
    assert priced.step(1, tokens([0, 0, 1, 0], [1, 0, 0, 0]), expert_s) == pytest.approx(1 * MS)
    assert (priced.hits, priced.misses) == (1, 1)
    c2 = context(experts=4, layers=2, slots=2)

    class Ahead(LfuExpertCache):  # wants expert 3 of layer 1 resident, whatever was routed
        def keep(self, resident, touched):
            out = np.zeros(c2.shape, bool)
            out[:, 0, :2] = True
            out[1, 0] = [True, False, False, True]
            return out

    priced = CachedExperts(Ahead(None, c2), c2, LINK, 1e6, lambda n: 0.5 * MS)
    priced.step(1, tokens([0, 0, 0, 0], [0, 0, 0, 0]), expert_s)
    assert priced.prefetches == 1
    # the prefetch of layer 1's expert 3 is issued at layer 0's router (0.5 ms) and lands at 1.5 ms, before
    # layer 1's router (0.5 + 2 + 0.5 = 3 ms): no stall, and it counts as a hit
    assert priced.step(1, tokens([1, 0, 0, 0], [0, 0, 0, 1]), expert_s) == 0.0
    assert (priced.hits, priced.misses, priced.prefetch_hits) == (2, 0, 1)
    # with no compute to hide behind, the same prefetch stalls layer 1 (issued at 0, lands at 1 ms)
    priced = CachedExperts(Ahead(None, c2), c2, LINK, 1e6, None)
    priced.step(1, tokens([0, 0, 0, 0], [0, 0, 0, 0]), np.zeros(2))
    assert priced.step(1, tokens([0, 0, 0, 0], [0, 0, 0, 1]), np.zeros(2)) == pytest.approx(1 * MS)


def summary(*overrides):
    with tempfile.TemporaryDirectory() as out:
        return run_job(compose(*MOE, *overrides), out).summary


def test_offloading_half_the_experts_grows_the_kv_pool_by_their_bytes_and_prices_the_misses():
    default = summary()
    none = summary("expert_cache=none")
    for key in ("tpot_ms", "ttft_ms", "num_kv_blocks", "sim_kv_pool_bytes_per_rank", "moe_mean_experts_touched"):
        assert none[key] == default[key]
    assert not any(k.startswith("moe_expert_cache") for k in default)
    lru = summary("expert_cache=lru", "sim.moe.expert_cache_slots=64")
    expert = 3 * 2048 * 768 * 2  # one Qwen3-30B-A3B expert in bfloat16
    assert default["sim_weight_bytes_per_rank"] - lru["sim_weight_bytes_per_rank"] == 64 * 48 * expert
    assert lru["sim_kv_pool_bytes_per_rank"] > default["sim_kv_pool_bytes_per_rank"] + 0.99 * 64 * 48 * expert
    assert lru["moe_expert_cache_misses"] > 0 and lru["moe_expert_cache_stall_s"] > 0
    assert lru["moe_expert_cache_bytes_loaded"] == lru["moe_expert_cache_misses"] * expert
    assert lru["tpot_ms"]["p50"] > default["tpot_ms"]["p50"]
    every = summary("expert_cache=lru", "sim.moe.expert_cache_slots=128")  # a cache of every expert never misses
    assert every["moe_expert_cache_misses"] == 0 and every["tpot_ms"] == default["tpot_ms"]


@pytest.mark.parametrize("overrides, message", [
    (("sim.moe.expert_cache_slots=8",), "sim.moe.expert_cache_slots=8 needs an expert cache"),
    (("expert_cache=lru",), "expert_cache=lru needs sim.moe.expert_cache_slots in 1..128"),
    (("expert_cache=lfu", "sim.moe.expert_cache_slots=200"), "in 1..128 .*got 200"),
    (("expert_cache=lru", "sim.moe.expert_cache_slots=4", "tensor_parallel_size=8", "expert_parallel_size=8",
      "expert_placement=eplb"), "re-planning every 3000 steps is not modelled"),
])
def test_bad_settings_are_one_line_naming_the_key(overrides, message):
    with pytest.raises(ConfigError, match=message):
        build_stack(compose("backend=sim", "model=qwen3_30b_a3b", "hardware=h100", *overrides))


def test_a_dense_model_or_a_real_backend_refuses_a_cache():
    with pytest.raises(ConfigError, match="expert_cache=lru needs a mixture-of-experts model"):
        build_stack(compose("backend=sim", "model=llama3_8b", "expert_cache=lru", "sim.moe.expert_cache_slots=1"))
    with pytest.raises(ConfigError, match="expert_cache=lru is priced by the simulator only"):
        build_stack(compose("model=tiny_moe", "expert_cache=lru", "sim.moe.expert_cache_slots=1"))
    assert build_stack(compose("model=tiny_moe")).plugins["expert_cache"].name == "none"


def test_the_kit_passes_the_builtins_and_names_a_cache_over_capacity():
    for cls, config in ((LruExpertCache, None), (LfuExpertCache, None), (PrefetchExpertCache, PrefetchConfig(0.5))):
        for ep, slots in ((1, 1), (2, 4), (4, 4)):
            assert _check_layout(cls, config, ep, slots, 0, Failure) is None
    assert _check_layout(NoExpertCache, None, 2, 8, 0, Failure) is None

    class Hoards(LruExpertCache):
        def keep(self, resident, touched):
            return resident | (touched > 0)

    failure = _check_layout(Hoards, None, 1, 2, 0, Failure)
    assert failure is not None and failure.contract == "capacity never exceeded"


def test_new_plugin_writes_a_cache_that_passes_the_kit_layouts(tmp_path, monkeypatch):
    from servelab.kit.new_plugin import new_plugin

    root = new_plugin("expert_cache", "window_freq", tmp_path)
    monkeypatch.syspath_prepend(str(root))
    import servelab_window_freq as module

    try:
        for ep, slots in ((1, 1), (1, 8), (2, 4)):
            assert _check_layout(module.WindowFreq, module.WindowFreqConfig(), ep, slots, 0, Failure) is None
    finally:
        sys.modules.pop("servelab_window_freq", None)


def test_check_plugin_passes_lru():
    from servelab.testing import check_plugin

    assert check_plugin("expert_cache", "lru").ok


@pytest.mark.slow
@pytest.mark.parametrize("name", ["none", "lfu", "prefetch"])
def test_check_plugin_passes_the_other_builtins(name):
    from servelab.testing import check_plugin

    assert check_plugin("expert_cache", name).ok
