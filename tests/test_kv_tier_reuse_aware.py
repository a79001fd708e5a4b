"""kv_tier_policy=reuse_aware: a full tier gives up a block the GPU holds too, else the deepest of
its least recently used ``window`` (the store tells it when the GPU gives a loaded block up); its
selective store: a depth group whose stored blocks leave the tiers unread stops being stored (but for
one block in ``explore``); one whose blocks are loaded keeps being stored; ``min_reuse=0`` stores
every evicted block, like write_back."""

from __future__ import annotations

from collections import OrderedDict
from types import SimpleNamespace

import pytest

from servelab.core.contexts import KVTierPolicyContext
from servelab.core.errors import ConfigError
from servelab.core.kv_tiers import TierBlock, TierSpec
from servelab.plugins.kv_tier_policies.reuse_aware import ReuseAwareConfig, ReuseAwarePolicy
from servelab.kv.tiers.store import TieredKVConnector

HOST = TierSpec("host", 1.0, 25.0, 25.0, 0.0, False, 100)


def _policy(**config) -> ReuseAwarePolicy:
    return ReuseAwarePolicy(ReuseAwareConfig(**config), KVTierPolicyContext(kv_tiers=(HOST,)))


def test_a_depth_whose_blocks_leave_unread_stops_being_stored_but_is_explored():
    policy = _policy(min_reuse=0.5, depth_bucket=4, explore=3)
    deep, shallow = TierBlock(b"d", 40), TierBlock(b"s", 1)
    for _ in range(3):
        assert policy.demote(0, deep) is None  # the last tier drops it, never loaded: wasted
    assert policy.reuse_estimate(deep) == pytest.approx(0.25)
    assert [policy.store_on_evict(deep) for _ in range(6)] == [None, None, 0, None, None, 0]
    policy.on_load(0, TierBlock(b"s", 1, loads=1))
    policy.demote(0, TierBlock(b"t", 2))
    assert policy.reuse_estimate(shallow) == pytest.approx(2 / 3) and policy.store_on_evict(shallow) == 0


def test_min_reuse_zero_stores_everything_and_bad_keys_are_one_line():
    policy = _policy()
    for _ in range(5):
        policy.demote(0, TierBlock(b"d", 40))
    assert policy.store_on_evict(TierBlock(b"d", 40)) == 0
    with pytest.raises(ConfigError, match="kv_tier_policy.min_reuse=2"):
        _policy(min_reuse=2)
    with pytest.raises(ConfigError, match="kv_tier_policy.explore=0"):
        _policy(explore=0)


def _held(*positions: int) -> "OrderedDict[bytes, TierBlock]":
    return OrderedDict((bytes([i]), TierBlock(bytes([i]), p)) for i, p in enumerate(positions))


def test_a_full_tier_gives_up_a_block_the_gpu_holds_too_then_the_deepest_of_its_window():
    policy = _policy(window=3)
    held = _held(0, 1, 5, 9)  # least recently used first
    assert policy.victim(0, held) == bytes([2])  # the deepest of the 3 oldest, not the LRU root
    policy.on_load(0, TierBlock(bytes([3]), 9, loads=1))
    policy.on_load(0, TierBlock(bytes([1]), 1, loads=1))
    assert policy.victim(0, held) == bytes([3])  # loaded first: the oldest the GPU holds too
    policy.on_gpu_evict(0, held[bytes([3])])
    assert policy.victim(0, held) == bytes([1])
    assert policy.demote(0, held.pop(bytes([1]))) is None  # the last tier drops it
    assert policy.victim(0, held) == bytes([3])  # the window now reaches the deepest


def test_the_store_tells_the_policy_when_the_gpu_gives_up_a_loaded_block():
    digests = [b"a", b"b"]
    subscribers = []
    allocator = SimpleNamespace(publishes_block_events=True, subscribe=subscribers.append)
    store = TieredKVConnector((HOST,), bytes_per_block=1, block_size=16)
    policy = _policy()
    store.bind(policy, allocator)
    evict = subscribers[0].on_block_evicted
    evict(b"a", 0)
    evict(b"b", 1)
    assert list(store.blocks[0]) == digests and not policy.on_gpu[0]
    seq = SimpleNamespace(id="r", num_computed_tokens=0, num_preemptions=0, block_hashes=list(digests),
                          token_ids=[0] * 33, num_tokens=33)
    assert store.get_num_new_matched_tokens(seq, 0) == (32, False)
    store.update_state_after_alloc(seq, [4, 5], 32)
    assert list(policy.on_gpu[0]) == digests
    evict(b"a", 4)  # the GPU's copy goes; the tier keeps its own
    assert list(policy.on_gpu[0]) == [b"b"] and list(store.blocks[0]) == digests
