"""Memory policies on the real (small, random-weight) model: prefix caching really skips the
cached tokens, and swap / recompute / adaptive preemption give the unconstrained run's tokens."""

from __future__ import annotations

import numpy as np
import pytest

from servelab.core.request import Request
from servelab.run.session import collect_results
from servelab.assemble.stack import build_stack

from memory_helpers import _cfg, run_requests, tokens_by_id

SMALL_MODEL = ("model.hidden_size=64", "model.intermediate_size=128", "model.num_hidden_layers=2",
               "model.num_attention_heads=4", "model.num_key_value_heads=2", "max_model_len=256",
               "max_num_batched_tokens=256")


def real_stack(*overrides):
    return build_stack(_cfg(SMALL_MODEL + tuple(overrides)))


def prompts(seed=0, n=6, prompt_len=30, max_tokens=20):
    rng = np.random.default_rng(seed)
    return [Request(f"r{i}", tuple(int(t) for t in rng.integers(0, 4096, prompt_len)), max_tokens) for i in range(n)]


@pytest.fixture(scope="module")
def unconstrained():
    requests = prompts()
    return requests, tokens_by_id(run_requests(real_stack("num_kv_blocks=256", "block_size=8"), requests))


# ---- prefix caching ------------------------------------------------------------------------
def _run_one_after_another(stack, requests):
    """Each request runs to the end before the next arrives, so earlier prompts are cached."""
    engine = stack.engine
    for req in requests:
        engine.add_request(req)
        while engine.has_unfinished():
            engine.step()
    return collect_results(engine, 1.0)


def test_prefix_caching_skips_exactly_the_shared_full_blocks():
    rng = np.random.default_rng(1)
    shared = [int(t) for t in rng.integers(0, 4096, 43)]  # 5 full blocks of 8 + 3 tokens
    requests = [Request(f"r{i}", tuple(shared + [int(t) for t in rng.integers(0, 4096, 10)]), 6) for i in range(4)]
    off = _run_one_after_another(real_stack("num_kv_blocks=128", "block_size=8"), requests)
    on = _run_one_after_another(real_stack("num_kv_blocks=128", "block_size=8", "allocator.prefix_caching=true"),
                                requests)
    assert tokens_by_id(on) == tokens_by_id(off)
    cached = 3 * 40  # requests 1..3 reuse 5 full blocks of the first prompt; the 3 extra tokens are partial
    assert [r["num_cached_prompt_tokens"] for r in on.requests] == [0, 40, 40, 40]
    assert off.summary["prefill_tokens_computed"] - on.summary["prefill_tokens_computed"] == cached
    assert on.summary["prefix_cache_hit_rate"] == pytest.approx(cached / (4 * 53))
    assert off.summary["prefix_cache_hit_rate"] == 0.0
    assert on.summary["leaked_blocks"] == 0


def test_the_model_runner_starts_at_the_first_uncached_token():
    stack = real_stack("num_kv_blocks=64", "block_size=8", "allocator.prefix_caching=true")
    base = tuple(range(1, 34))  # 4 full blocks + 1
    _run_one_after_another(stack, [Request("a", base, 2)])
    seen = []
    original = stack.executor.execute
    stack.executor.execute = lambda batch: (seen.append(batch), original(batch))[1]
    _run_one_after_another(stack, [Request("b", base[:32] + (7, 7, 7), 2)])
    first = seen[0]
    assert first.positions.tolist()[0] == 32 and first.num_tokens == 3


# ---- preemption ----------------------------------------------------------------------------
@pytest.mark.parametrize("policy, kind", [("recompute", "recompute"), ("swap", "swap"), ("adaptive", None)])
def test_preemption_policies_give_the_unconstrained_tokens(unconstrained, policy, kind):
    requests, expected = unconstrained
    stack = real_stack("num_kv_blocks=16", "block_size=8", f"preemption={policy}", "backend.num_swap_blocks=64")
    result = run_requests(stack, requests)
    assert tokens_by_id(result) == expected
    by_kind = result.summary["num_preemptions_by_kind"]
    assert result.summary["num_preemptions"] > 0
    if kind:
        assert set(by_kind) == {kind}
    assert result.summary["leaked_blocks"] == 0
    if "swap" in by_kind:
        per_block = stack.executor.bytes_per_block
        assert result.summary["swap_out_bytes"] == result.summary["swap_in_bytes"] > 0
        assert result.summary["swap_out_bytes"] % per_block == 0
    if "recompute" in by_kind:
        assert result.summary["recomputed_tokens"] > 0
    if policy == "adaptive":
        decisions = [p for s in result.steps for p in s.preempted]
        assert all({"swap_s", "recompute_s"} <= set(p.estimates) for p in decisions)


def test_adaptive_recomputes_when_the_link_is_slow(unconstrained):
    requests, expected = unconstrained
    stack = real_stack("num_kv_blocks=16", "block_size=8", "preemption=adaptive", "backend.num_swap_blocks=64",
                       "backend.swap_bandwidth_gb_s=1e-6")
    result = run_requests(stack, requests)
    assert tokens_by_id(result) == expected
    assert set(result.summary["num_preemptions_by_kind"]) == {"recompute"}


def test_swap_with_prefix_caching_and_a_small_host_pool(unconstrained):
    requests, expected = unconstrained
    stack = real_stack("num_kv_blocks=16", "block_size=8", "preemption=swap", "backend.num_swap_blocks=5",
                       "allocator.prefix_caching=true", "max_num_batched_tokens=16", "max_num_seqs=8")
    result = run_requests(stack, requests)
    assert tokens_by_id(result) == expected
    assert result.summary["leaked_blocks"] == 0
    reasons = {p.reason for s in result.steps for p in s.preempted if p.kind == "recompute"}
    assert any("host swap pool" in r for r in reasons)
