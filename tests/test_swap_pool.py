"""preemption=swap|adaptive get a host pool by default; an explicit zero pool warns (issue 15)."""

from __future__ import annotations

import logging

import pytest

from conftest import compose
from servelab.assemble import swap_pool
from servelab.assemble.stack import build_stack
from servelab.assemble.swap_pool import DEFAULT_SWAP_SPACE_GB, swap_pool_config

SMALL = ("model.hidden_size=64", "model.num_hidden_layers=2", "model.intermediate_size=128", "num_kv_blocks=16")


@pytest.mark.parametrize("policy, uses", [("swap", True), ("adaptive", True), ("recompute", False)])
def test_default_pool_only_for_policies_that_swap(policy, uses, monkeypatch):
    monkeypatch.setattr(swap_pool, "host_free_bytes", lambda: 64 * 2**30)
    cfg = compose(f"preemption={policy}")
    assert swap_pool_config(cfg, uses) == ((0, DEFAULT_SWAP_SPACE_GB) if uses else (0, None))


def test_default_pool_is_capped_by_free_host_memory(monkeypatch):
    monkeypatch.setattr(swap_pool, "host_free_bytes", lambda: 3 * 2**30)
    assert swap_pool_config(compose("preemption=swap"), True) == (0, 1.5)


def test_configured_pool_wins_including_zero():
    assert swap_pool_config(compose("preemption=swap", "backend.num_swap_blocks=0"), True) == (0, None)
    assert swap_pool_config(compose("preemption=swap", "backend.swap_space_gb=0.25"), True) == (0, 0.25)


def test_swap_on_the_real_model_gets_a_host_pool_that_swaps(monkeypatch):
    monkeypatch.setattr(swap_pool, "DEFAULT_SWAP_SPACE_GB", 0.001)  # ~1 MiB: the test stays small
    stack = build_stack(compose("preemption=swap", *SMALL))
    try:
        expected = int(0.001 * 2**30 // stack.executor.bytes_per_block)
        assert stack.executor.num_swap_blocks == expected > 0
        assert stack.engine.allocator.num_swap_blocks == expected
    finally:
        stack.executor.shutdown()


def test_the_simulator_gets_the_default_pool():
    stack = build_stack(compose("backend=sim", "model=llama3_8b", "preemption=adaptive"))
    assert stack.executor.num_swap_blocks == int(DEFAULT_SWAP_SPACE_GB * 2**30 // stack.executor.bytes_per_block)


def test_an_explicit_zero_pool_warns(caplog):
    with caplog.at_level(logging.WARNING):
        stack = build_stack(compose("preemption=swap", "backend.swap_space_gb=0", *SMALL))
    assert stack.executor.num_swap_blocks == 0
    assert "host swap pool of 0 blocks" in caplog.text
