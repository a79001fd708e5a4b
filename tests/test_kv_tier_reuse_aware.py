"""kv_tier_policy=reuse_aware's selective store: a depth group whose stored blocks leave the tiers
unread stops being stored (but for one block in ``explore``); one whose blocks are loaded keeps
being stored; ``min_reuse=0`` stores every evicted block, like write_back."""

from __future__ import annotations

import pytest

from servelab.core.contexts import KVTierPolicyContext
from servelab.core.errors import ConfigError
from servelab.core.kv_tiers import TierBlock, TierSpec
from servelab.plugins.kv_tier_policies.reuse_aware import ReuseAwareConfig, ReuseAwarePolicy

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
