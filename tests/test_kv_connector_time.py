"""The connector reports its own time and moves bytes in its worker-side calls (issue 44, item 4):
the tiered store queues its copies and runs them, in the order decided, in ``start_load_kv`` /
``save_kv``; it reports each step's load seconds (``get_step_transfer_time``), which the engine
prices the same way for every connector (``price_kv_transfer``)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from servelab.core.contexts import KVTierPolicyContext
from servelab.core.kv_connector import NO_TRANSFER, KVConnector, KVTransferTime
from servelab.core.kv_tiers import TierSpec
from servelab.engine.clock import WallClock, price_kv_transfer
from servelab.kv.tiers.store import TieredKVConnector
from servelab.plugins.kv_tier_policies.write_back import WriteBackPolicy

HOST = TierSpec("host", 1.0, 1.0, 1.0, 0.0, False, 2)  # 1 GB/s, no latency, two blocks


class _Pools:
    """Records the copies the store asks for."""

    def __init__(self):
        self.calls = []

    def save(self, tier, slot, block):
        self.calls.append(("save", tier, slot, block))

    def load(self, tier, slot, block):
        self.calls.append(("load", tier, slot, block))

    def move(self, tier, slot, to_tier, to_slot):
        self.calls.append(("move", tier, slot, to_tier, to_slot))


def _store(load="overlap"):
    subscribers = []
    allocator = SimpleNamespace(publishes_block_events=True, subscribe=subscribers.append)
    store = TieredKVConnector((HOST,), bytes_per_block=10**9, block_size=16, load=load)
    store.bind(WriteBackPolicy(WriteBackPolicy.Config(), KVTierPolicyContext(kv_tiers=(HOST,))), allocator)
    return store, _Pools()


def _seq(digests):
    n = 16 * len(digests)
    return SimpleNamespace(id="r", num_computed_tokens=0, num_preemptions=0, block_hashes=list(digests),
                           token_ids=[0] * (n + 1), num_tokens=n + 1)


def test_bytes_move_in_the_worker_side_calls_in_the_order_decided():
    store, pools = _store()
    store.attach_bytes(pools)
    store.on_block_evicted(b"a", 7)  # write-back: decided now, copied later
    store.on_block_evicted(b"b", 8)
    assert pools.calls == []
    seq = _seq([b"a", b"b"])
    assert store.get_num_new_matched_tokens(seq, 0) == (32, False)
    store.update_state_after_alloc(seq, [3, 4], 32)
    store.on_block_evicted(b"c", 9)  # the tier is full: b"a" (least recently used... loaded) or b"b" leaves
    assert pools.calls == []  # nothing moved on the scheduler's side
    store.start_load_kv()
    kinds = [c[0] for c in pools.calls]
    assert kinds == ["save", "save", "load", "load", "save"]
    saved_a, saved_b, load_a, load_b, saved_c = pools.calls
    assert (load_a[2], load_a[3]) == (saved_a[2], 3) and (load_b[2], load_b[3]) == (saved_b[2], 4)
    assert saved_c[2] in (saved_a[2], saved_b[2])  # a slot given up is reused only after its load ran
    store.save_kv()
    assert len(pools.calls) == 5  # each copy runs once


@pytest.mark.parametrize("load", ["overlap", "serialize"])
def test_the_store_reports_each_steps_load_seconds_once(load):
    store, _ = _store(load)
    store.on_block_evicted(b"a", 7)
    seq = _seq([b"a"])
    n, _ = store.get_num_new_matched_tokens(seq, 0)
    store.update_state_after_alloc(seq, [3], n)
    transfer = store.get_step_transfer_time()
    assert transfer == KVTransferTime(pytest.approx(1.0), 0.0, load == "overlap")  # 1 GB over 1 GB/s
    assert store.get_step_transfer_time() is NO_TRANSFER


def test_every_clock_prices_a_transfer_by_one_rule():
    virtual = SimpleNamespace(kind="virtual", t=0.0)
    virtual.sleep = lambda s: setattr(virtual, "t", virtual.t + s)
    assert price_kv_transfer(virtual, 0.4, KVTransferTime(1.0, 0.0, True)) == (pytest.approx(0.6), pytest.approx(0.4))
    assert price_kv_transfer(virtual, 2.0, KVTransferTime(1.0, 0.0, True)) == (0.0, 1.0)
    assert price_kv_transfer(virtual, 0.4, KVTransferTime(1.0, 0.0, False)) == (1.0, 0.0)
    assert virtual.t == pytest.approx(1.6)
    assert price_kv_transfer(WallClock(), 0.4, KVTransferTime(1.0)) == (0.0, 0.0)  # timed as the copies ran
    assert KVConnector().get_step_transfer_time() is NO_TRANSFER
