"""Property test: memory policies never change what is generated.

Random workloads (with shared prefixes) x allocator x preemption policy x block size (1, 4, 16)
x prefix caching x chunked prefill, on tiny pools that force preemption: every request finishes
or is rejected for a stated reason, no block leaks, ref counts return to 0, and the tokens equal
the unconstrained run. The :class:`KVCheckingExecutor` samples from the KV it reads back through
the block tables, so a wrong table, a lost swap copy or a reused prefix block changes tokens.

CI runs the ``ci`` profile (60 examples); ``SERVELAB_HYPOTHESIS_PROFILE=long pytest
tests/test_memory_invariance.py`` runs 3000 by hand (``SERVELAB_HYPOTHESIS_EXAMPLES=N`` any number).
"""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from servelab.core.request import Request

from memory_helpers import fake_stack, run_requests, tokens_by_id, workloads

settings.register_profile("ci", max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("long", max_examples=3000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
PROFILE = os.environ.get("SERVELAB_HYPOTHESIS_PROFILE", "ci")
if os.environ.get("SERVELAB_HYPOTHESIS_EXAMPLES"):  # e.g. 500: between ci and long
    settings.register_profile("custom", settings.get_profile(PROFILE),
                              max_examples=int(os.environ["SERVELAB_HYPOTHESIS_EXAMPLES"]))
    PROFILE = "custom"

MAX_MODEL_LEN = 128


@st.composite
def memory_stacks(draw):
    allocator = draw(st.sampled_from(["paged", "contiguous"]))
    overrides = [
        f"allocator={allocator}",
        f"preemption={draw(st.sampled_from(['recompute', 'swap', 'adaptive']))}",
        f"block_size={draw(st.sampled_from([1, 4, 16]))}",
        f"chunked_prefill={str(draw(st.booleans())).lower()}",
        f"max_model_len={MAX_MODEL_LEN}",
        "max_num_seqs=8",
    ]
    if allocator == "paged":
        overrides.append(f"allocator.prefix_caching={str(draw(st.booleans())).lower()}")
    chunked = overrides[3].endswith("true")
    budget = draw(st.sampled_from([16, 32, MAX_MODEL_LEN])) if chunked else MAX_MODEL_LEN
    overrides.append(f"max_num_batched_tokens={budget}")
    return overrides, draw(st.floats(0.3, 1.2)), draw(st.sampled_from([0, 2, 8, 64]))


def _blocks(tokens: int, block_size: int) -> int:
    return -(-tokens // block_size)


def _reference(requests):
    return tokens_by_id(run_requests(fake_stack([f"max_model_len={MAX_MODEL_LEN}", "block_size=16",
                                                 f"max_num_batched_tokens={MAX_MODEL_LEN}"], 512), requests))


@settings(settings.get_profile(PROFILE))
@given(requests=workloads(), stack_spec=memory_stacks())
def test_memory_policies_never_change_tokens(requests, stack_spec):
    overrides, pool_factor, swap_blocks = stack_spec
    block_size = int(next(o for o in overrides if o.startswith("block_size=")).split("=")[1])
    largest = max(_blocks(r.prompt_len + r.max_tokens, block_size) for r in requests)
    total = sum(_blocks(r.prompt_len + r.max_tokens, block_size) for r in requests)
    # tiny pools: from below the largest request (some rejections) to a fraction of the total
    num_blocks = max(1, int(round(pool_factor * max(largest, total // 3))))
    stack = fake_stack(overrides, num_blocks, swap_blocks)
    result = run_requests(stack, requests)
    expected = _reference(requests)

    for rec in result.requests:
        if rec["rejected_reason"] is not None:
            needed = rec["prompt_len"] + rec["max_tokens"]
            assert not stack.engine.allocator.can_ever_fit(needed), rec
        else:
            assert rec["finish_reason"] == "length", rec
            assert rec["output_token_ids"] == expected[rec["id"]], (rec["id"], overrides)
    assert result.summary["leaked_blocks"] == 0
    alloc = stack.engine.allocator
    if hasattr(alloc, "ref_counts"):
        assert all(r == 0 for r in alloc.ref_counts)
        assert len(alloc.free_host) == alloc.num_swap_blocks
    if "preemption=recompute" in overrides or swap_blocks == 0:
        assert "swap" not in result.summary["num_preemptions_by_kind"]


def test_the_checker_catches_a_lost_swap_copy(monkeypatch):
    """The property above can fail: lose the swap-in copies and what the checker reads back is
    another sequence's KV: the tokens change, or a slot holds the wrong position and it raises."""
    from servelab.kit.testing import KVCheckingExecutor

    requests = [Request(f"r{i}", tuple(range(i * 10, i * 10 + 20)), 12) for i in range(4)]
    expected = _reference(requests)
    copy = KVCheckingExecutor._copy

    def lose_swap_ins(self, pairs, src_kv, dst_kv):
        if src_kv is not self.host_kv:
            copy(self, pairs, src_kv, dst_kv)

    monkeypatch.setattr(KVCheckingExecutor, "_copy", lose_swap_ins)
    stack = fake_stack(["preemption=swap", "block_size=4", f"max_model_len={MAX_MODEL_LEN}"], 14, 64)
    try:
        result = run_requests(stack, requests)
    except AssertionError as exc:
        assert "KV slot" in str(exc)
    else:
        assert tokens_by_id(result) != expected
    assert stack.engine.steps and any(s.swap_in_blocks for s in stack.engine.steps)


def test_the_checker_catches_skipped_tokens_that_are_not_cached(monkeypatch):
    """An admit() that claims more cached tokens than the cache holds is caught."""
    from servelab.plugins.allocators.paged import PagedAllocator

    shared = tuple(range(100, 124))
    requests = [Request("a", shared + (1,), 4), Request("b", shared + (2,), 4)]
    expected = _reference(requests)
    real = PagedAllocator.admit

    def admit_everything(self, seq):  # claims the whole prompt is cached
        n = real(self, seq)
        return max(n, (seq.num_tokens - 1) // self.block_size * self.block_size) if seq.id == "b" else n

    monkeypatch.setattr(PagedAllocator, "admit", admit_everything)
    stack = fake_stack(["allocator.prefix_caching=true", "block_size=4", f"max_model_len={MAX_MODEL_LEN}"], 64)
    with pytest.raises(AssertionError):
        assert tokens_by_id(run_requests(stack, requests)) == expected


def _fixed_workload():
    shared = tuple(range(300, 340))
    return [Request(f"f{i}", shared[:10 * (i % 4)] + tuple(range(i * 20, i * 20 + 15 + i)), 10 + i % 5,
                    arrival_time=0.01 * (i // 3)) for i in range(9)]


COMBINATIONS = [(a, p, bs, pc, ch) for a in ("paged", "contiguous") for p in ("recompute", "swap", "adaptive")
                for bs in (1, 4, 16) for pc in (False, True) for ch in (False, True) if not (a == "contiguous" and pc)]


@pytest.mark.parametrize("allocator, policy, block_size, prefix_caching, chunked", COMBINATIONS)
def test_every_combination_on_a_fixed_workload(allocator, policy, block_size, prefix_caching, chunked):
    """Each point of the grid at least once per CI run (hypothesis samples it at random)."""
    requests = _fixed_workload()
    overrides = [f"allocator={allocator}", f"preemption={policy}", f"block_size={block_size}",
                 f"chunked_prefill={str(chunked).lower()}", f"max_model_len={MAX_MODEL_LEN}", "max_num_seqs=8",
                 f"max_num_batched_tokens={32 if chunked else MAX_MODEL_LEN}"]
    if allocator == "paged":
        overrides.append(f"allocator.prefix_caching={str(prefix_caching).lower()}")
    largest = max(_blocks(r.prompt_len + r.max_tokens, block_size) for r in requests)
    stack = fake_stack(overrides, largest + 2, 16 * largest)
    result = run_requests(stack, requests)
    assert tokens_by_id(result) == _reference(requests)
    assert result.summary["num_finished"] == len(requests) and result.summary["leaked_blocks"] == 0
    if allocator == "paged":
        assert result.summary["num_preemptions"] > 0  # the pool is tight enough to preempt
        if policy == "swap":
            assert result.summary["num_preemptions_by_kind"].get("swap", 0) > 0
