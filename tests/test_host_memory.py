"""One host memory (issue 44, item 8): with tiers on, swap-out and the host tier draw from one host
pool (the tier's capacity) at one price (the tier's link); with tiers off the swap pool is as before."""

from __future__ import annotations

from collections import deque

from servelab.api import compose
from servelab.assemble.stack import build_stack
from servelab.core.errors import ConfigError
from servelab.core.request import Request
from servelab.kv.connectors import find_part
from servelab.kv.tiers.host_memory import HostMemory, SwapSlots
from servelab.kv.tiers.store import TieredKVConnector
from servelab.run.runner import run_workload

import pytest

SIM = ["backend=sim", "model=tiny_code", "logger=none", "progress=false", "preemption=swap", "block_size=16"]
TIERS = ["kv_tiers=host", "kv_tier_policy=write_through"]


def _gib(stack, blocks: int) -> float:
    return blocks * stack.executor.bytes_per_block / 2**30


def _requests(vocab: int, n: int = 16) -> list[Request]:
    shared = tuple((7 * j) % (vocab - 1) + 1 for j in range(64))
    return [Request(f"r{i}", shared + tuple((11 * i + j) % (vocab - 1) + 1 for j in range(20 + 7 * (i % 5))), 40,
                    arrival_time=0.0) for i in range(n)]


def test_tiers_off_the_swap_pool_is_its_own_as_before():
    stack = build_stack(compose(SIM))
    allocator = stack.engine.allocator
    assert isinstance(allocator.free_host, deque) and len(allocator.free_host) == stack.executor.num_swap_blocks > 0
    host = stack.time_model.context.hardware
    assert host.host_link_gb_s == build_stack(compose(SIM[:-2])).time_model.context.hardware.host_link_gb_s


def test_tiers_on_swap_and_the_host_tier_share_one_memory_and_one_price():
    probe = build_stack(compose(SIM))
    capacity = _gib(probe, 24)
    cfg = compose([*SIM, *TIERS, f"kv_tiers.tiers.0.capacity_gib={capacity}", "kv_tiers.tiers.0.read_gb_s=8",
                   "kv_tiers.tiers.0.write_gb_s=8", "num_kv_blocks=40", "max_num_seqs=16"])
    stack = build_stack(cfg)
    store = find_part(stack.engine.connector, TieredKVConnector)
    memory = store.host_memory
    assert isinstance(memory, HostMemory) and memory.num_blocks == 24 == stack.executor.num_swap_blocks
    assert isinstance(stack.engine.allocator.free_host, SwapSlots)  # the swap's free blocks are the memory's
    assert stack.time_model.context.hardware.host_link_gb_s == 8  # swaps cross the tier's link
    seen = []
    take = memory.take_for_swap

    def checked() -> int:
        slot = take()
        seen.append(memory.swapped + len(store.blocks[0]))
        return slot

    memory.take_for_swap = checked
    engine = stack.engine
    run_workload(engine, _requests(stack.executor.spec.vocab_size))
    assert all(s.is_finished for s in engine.sequences.values()) and engine.allocator.leaked_blocks() == 0
    assert seen and max(seen) <= 24  # swapped and tier blocks never above the one memory
    assert memory.max_swapped > 0 and memory.swapped == 0
    assert memory.reclaimed > 0 and store.written_blocks[0] > 0  # the tier gave blocks up to swap-outs
    assert store.leaked() == 0


def test_a_swap_pool_of_its_own_beside_tiers_is_refused_in_one_line():
    with pytest.raises(ConfigError, match=r"^backend.swap_space_gb=2.0 with kv_tiers=host: swap-out and the host tier "
                                          r"share one host memory, sized by kv_tiers.tiers.0.capacity_gib"):
        build_stack(compose([*SIM, *TIERS, "backend.swap_space_gb=2.0"]))


@pytest.mark.slow
def test_on_a_real_engine_swapped_and_tier_blocks_live_in_one_host_pool_and_tokens_stay_equal():
    real = ["model=tiny", "clock=virtual", "time_model=roofline", "hardware=h100", "logger=none", "progress=false"]
    one = build_stack(compose(real))
    requests = _requests(one.executor.spec.vocab_size, 10)
    run_workload(one.engine, requests)
    ref = {s.id: list(s.output_token_ids) for s in one.engine.sequences.values()}

    gib = _gib(one, 16)
    stack = build_stack(compose([*real, "preemption=swap", *TIERS, f"kv_tiers.tiers.0.capacity_gib={gib}",
                                 "num_kv_blocks=36", "max_num_seqs=10"]))
    store = find_part(stack.engine.connector, TieredKVConnector)
    assert store.pools.data[0].tensor is stack.executor.host_pool.data  # the tier's slots are the swap pool's blocks
    run_workload(stack.engine, requests)
    got = {s.id: list(s.output_token_ids) for s in stack.engine.sequences.values()}
    assert got == ref
    assert store.host_memory.max_swapped > 0 and stack.engine.allocator.leaked_blocks() == 0
