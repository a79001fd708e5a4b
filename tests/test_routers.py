"""The built-in routers place requests as their docstrings say (on hand-made replica views), refuse
bad keys naming them, and pass the conformance kit; deliberately broken routers are caught with the
broken contract named."""

from __future__ import annotations

import itertools
import sys

import pytest

from servelab.core.hookspecs import hookimpl
from servelab.core.interfaces import ReplicaView, Router, RouterContext
from servelab.core.registry import build_registry, default_registry
from servelab.core.request import Request
from servelab.kit.conformance import main as check_plugin_main
from servelab.kit.conformance_router import SPREAD_REQUESTS, router_scenario
from servelab.testing import check_plugin, servelab_plugin_manager
from servelab.plugins.routers import BUILTIN
from servelab.plugins.routers.least_outstanding import LeastOutstandingRouter
from servelab.plugins.routers.power_of_two import PowerOfTwoRouter
from servelab.plugins.routers.prefix_affinity import PrefixAffinityRouter
from servelab.plugins.routers.round_robin import RoundRobinRouter
from servelab.plugins.routers.session import SessionRouter

BS = 4  # tokens per block in the hand-made views


def view(index, out=0, tokens=0, can_hold=True, role="mixed", blocks=64):
    return ReplicaView(index=index, role=role, can_hold=can_hold, num_outstanding=out, outstanding_tokens=tokens,
                       num_waiting=0, num_running=out, kv_utilization=0.0, num_kv_blocks=blocks, block_size=BS)


def views(*outs, role="mixed", first=0, cannot=()):
    return [view(first + i, out, can_hold=first + i not in cannot, role=role) for i, out in enumerate(outs)]


def router(cls, seed=0, n=4, **fields):
    return cls(cls.Config(**fields), RouterContext(tuple(views(*[0] * n)), seed))


def request(rid, prompt=(1, 2, 3, 4), client=None, salt=None, max_tokens=4):
    return Request(rid, tuple(prompt), max_tokens, client_id=client, cache_salt=salt)


def test_every_builtin_is_registered_with_a_typed_config():
    assert default_registry().names("router") == sorted(cls.name for cls in BUILTIN)
    assert {c.name for c in BUILTIN} == {"round_robin", "least_outstanding", "power_of_two", "prefix_affinity",
                                         "session"}
    for cls in BUILTIN:
        assert cls.__module__ and sys.modules[cls.__module__].__doc__.startswith(f"``router={cls.name}``")


# ---- round_robin ---------------------------------------------------------------------------------
def test_round_robin_cycles_skips_what_cannot_hold_and_keeps_a_turn_per_pool():
    r = router(RoundRobinRouter)
    assert [r.route(request(f"a{i}"), views(0, 0, 0), 0.0) for i in range(6)] == [0, 1, 2, 0, 1, 2]
    r = router(RoundRobinRouter)
    assert [r.route(request(f"b{i}"), views(0, 0, 0, cannot={1}), 0.0) for i in range(4)] == [0, 2, 0, 2]
    r = router(RoundRobinRouter)
    prefill, decode = views(0, 0, role="prefill"), views(0, 0, 0, role="decode", first=2)
    assert [r.route(request("p0"), prefill, 0.0), r.route(request("d0"), decode, 0.0),
            r.route(request("p1"), prefill, 0.0), r.route(request("d1"), decode, 0.0),
            r.route(request("p2"), prefill, 0.0)] == [0, 2, 1, 3, 0]


# ---- least_outstanding -----------------------------------------------------------------------------
def test_least_outstanding_by_requests_and_by_tokens():
    by_requests = router(LeastOutstandingRouter)
    assert by_requests.route(request("a"), views(3, 1, 1), 0.0) == 1  # tie: the lower index
    assert by_requests.route(request("b"), views(3, 1, 0, cannot={2}), 0.0) == 1
    loads = [view(0, out=1, tokens=500), view(1, out=2, tokens=100)]
    assert by_requests.route(request("c"), loads, 0.0) == 0
    assert router(LeastOutstandingRouter, by="tokens").route(request("c"), loads, 0.0) == 1


# ---- power_of_two ----------------------------------------------------------------------------------
def _placements(r, offered, n=60):
    return [r.route(request(f"r{i}"), offered, 0.0) for i in range(n)]


def test_power_of_two_is_deterministic_by_seed_and_never_picks_what_cannot_hold():
    offered = views(0, 0, 0, 0, 0, cannot={1, 3})
    a, b = (_placements(router(PowerOfTwoRouter, seed=7), offered) for _ in range(2))
    assert a == b
    assert set(a) == {0, 2}  # two of the three that hold are sampled; all idle: the lower index of the two wins
    single = [_placements(router(PowerOfTwoRouter, seed=s, choices=1), offered) for s in (7, 8)]
    assert set(single[0]) == {0, 2, 4} and single[0] != single[1]


def test_power_of_two_takes_the_less_loaded_of_its_two():
    # Only two can hold: they are the sample, and the less loaded wins whatever the draw.
    assert set(_placements(router(PowerOfTwoRouter), views(5, 9, 2, cannot={0}))) == {2}


# ---- prefix_affinity -------------------------------------------------------------------------------
SHARED = tuple(range(100, 112))  # three blocks


def test_prefix_affinity_sends_a_shared_prefix_back_and_respects_the_load_cap():
    r = router(PrefixAffinityRouter)
    assert r.route(request("a", SHARED + (1, 2, 3, 4)), views(1, 0, 0), 0.0) == 1  # no match: fewest outstanding
    assert r.route(request("b", SHARED + (5, 6, 7, 8)), views(1, 1, 0), 0.0) == 1  # 3 blocks match on 1
    assert r.match(request("c", SHARED + (9,)), view(1)) == 3 and r.match(request("c", SHARED), view(2)) == 0
    # 1 is over the cap (20 > 1.5 x 0 + 8): the least loaded of the rest
    assert r.route(request("c", SHARED + (9, 9, 9, 9)), views(0, 20, 0), 0.0) == 0
    for balance_abs, chosen in ((8, 1), (7, 0)):  # 8 outstanding: at the default cap, a candidate
        r = router(PrefixAffinityRouter, balance_abs=balance_abs)
        r.route(request("a", SHARED), views(1, 0, 0), 0.0)
        assert r.route(request("d", SHARED), views(0, 8, 0), 0.0) == chosen


def test_prefix_affinity_does_not_follow_a_short_match():
    r = router(PrefixAffinityRouter)
    system = tuple(range(100, 108))  # two blocks every request shares
    assert r.route(request("a", system + tuple(range(24))), views(0, 0, 0), 0.0) == 0
    # 2 of 8 blocks match on 0 (25% < cache_threshold 0.5): the replica with the most cache room
    assert r.route(request("b", system + tuple(range(50, 74))), views(0, 0, 0), 0.0) == 1
    # 7 of 8 match on 0: followed
    assert r.route(request("c", system + tuple(range(20)) + (9, 9, 9, 9)), views(0, 0, 0), 0.0) == 0
    r = router(PrefixAffinityRouter, cache_threshold=0.0)
    r.route(request("a", system + tuple(range(24))), views(0, 0, 0), 0.0)
    assert r.route(request("b", system + tuple(range(50, 74))), views(0, 0, 0), 0.0) == 0
    with pytest.raises(ValueError, match=r"router.cache_threshold=1.5 must be in \[0, 1\]"):
        router(PrefixAffinityRouter, cache_threshold=1.5)


def test_prefix_affinity_keeps_salted_tenants_apart():
    r = router(PrefixAffinityRouter)
    assert r.route(request("a", SHARED, salt="x"), views(1, 0), 0.0) == 1
    assert r.route(request("b", SHARED, salt="y"), views(1, 1), 0.0) == 0  # no match for another salt
    assert r.route(request("c", SHARED, salt="x"), views(0, 1), 0.0) == 1
    assert r.route(request("d", SHARED), views(0, 1), 0.0) == 0  # nor for no salt


def test_prefix_affinity_forgets_beyond_capacity_from_the_tail():
    r = router(PrefixAffinityRouter)
    small = [view(0, blocks=6)]
    first, second = request("a", range(16)), request("b", range(50, 66))
    r.route(first, small, 0.0)
    assert r.match(first, small[0]) == 4
    r.route(second, small, 0.0)  # 8 blocks for 6: two of a's go, its last two
    assert r.match(second, small[0]) == 4 and r.match(first, small[0]) == 2
    r = router(PrefixAffinityRouter, capacity_fraction=0.5)
    r.route(first, small, 0.0)
    assert r.match(first, small[0]) == 3


def test_prefix_affinity_ignores_a_partial_last_block():
    r = router(PrefixAffinityRouter)
    r.route(request("a", SHARED + (1, 2)), views(0), 0.0)
    assert r.match(request("b", SHARED + (1, 2)), view(0)) == 3


# ---- session -------------------------------------------------------------------------------------
def test_session_sticks_by_client_and_replaces_when_the_replica_cannot_hold():
    r = router(SessionRouter)
    assert r.route(request("a", client="c1"), views(2, 0, 1), 0.0) == 1  # first: least outstanding
    assert r.route(request("b", client="c1"), views(0, 5, 0), 0.0) == 1  # sticky
    assert r.route(request("c", client="c2"), views(0, 5, 0), 0.0) == 0
    assert r.route(request("d", client="c1"), views(3, 5, 2, cannot={1}), 0.0) == 2  # re-placed ...
    assert r.route(request("e", client="c1"), views(0, 0, 4), 0.0) == 2  # ... and sticks there
    assert r.route(request("f"), views(3, 0, 4), 0.0) == 1  # anonymous: by load, sticks nowhere
    assert r.route(request("g"), views(0, 3, 4), 0.0) == 0


def test_session_keeps_one_mapping_per_pool():
    r = router(SessionRouter)
    assert r.route(request("a", client="c1"), views(1, 0, role="prefill"), 0.0) == 1
    assert r.route(request("a", client="c1"), views(0, 1, role="decode", first=2), 0.0) == 2
    assert r.route(request("b", client="c1"), views(0, 0, role="prefill"), 0.0) == 1
    assert r.route(request("b", client="c1"), views(1, 0, role="decode", first=2), 0.0) == 2


# ---- configs -------------------------------------------------------------------------------------
@pytest.mark.parametrize("cls, fields, message", [
    (LeastOutstandingRouter, {"by": "bytes"}, "router.by='bytes' must be one of 'requests', 'tokens'"),
    (PowerOfTwoRouter, {"choices": 0}, "router.choices=0 must be >= 1"),
    (PowerOfTwoRouter, {"by": "kv"}, "router.by='kv'"),
    (PrefixAffinityRouter, {"balance_abs": -1}, "router.balance_abs=-1 must be >= 0"),
    (PrefixAffinityRouter, {"balance_rel": 0.5}, "router.balance_rel=0.5 must be >= 1"),
    (PrefixAffinityRouter, {"capacity_fraction": 0.0}, "router.capacity_fraction=0 must be > 0"),
    (SessionRouter, {"by": "clients"}, "router.by='clients'"),
])
def test_bad_keys_are_value_errors_naming_the_key(cls, fields, message):
    with pytest.raises(ValueError, match=message.replace(".", r"\.")):
        router(cls, **fields)


# ---- the conformance kit -------------------------------------------------------------------------
def test_the_kits_scenarios_offer_replicas_that_cannot_hold_and_both_pools():
    scenarios = [router_scenario(s) for s in range(6)]
    assert {s.disaggregated for s in scenarios} == {True, False}
    assert any(r.prompt_len + r.max_tokens > min(x.capacity_tokens for x in s.replicas)
               for s in scenarios for r in s.requests)


@pytest.mark.parametrize("name", [cls.name for cls in BUILTIN])
def test_every_builtin_passes_the_kit(name):
    report = check_plugin("router", name, cases=12, real_model=False)  # the stage behind servelab route: below
    assert report.ok, str(report)
    assert report.cases == 12 and not report.real_model
    assert "the run behind servelab route skipped" in str(report)


def test_a_builtin_passes_the_kit_behind_servelab_route():
    report = check_plugin("router", "round_robin", cases=2)
    assert report.ok, str(report)
    assert "ran behind servelab route: 2 tiny_code replicas, 6 requests" in str(report)


@pytest.mark.slow
@pytest.mark.parametrize("name", [cls.name for cls in BUILTIN])
def test_every_builtin_passes_the_kit_behind_servelab_route(name):
    report = check_plugin("router", name, cases=2)
    assert report.ok, str(report)
    assert "ran behind servelab route" in str(report)


def test_the_kit_takes_the_routers_keys_and_refuses_a_bad_one(capsys):
    assert check_plugin("router", "prefix_affinity", cases=2, real_model=False, overrides=("router.balance_abs=0",)).ok
    report = check_plugin("router", "prefix_affinity", cases=2, overrides=("router.capacity_fraction=0",))
    assert report.contracts_broken == ["plugin raised"] and "router.capacity_fraction=0 must be > 0" in str(report)
    assert check_plugin_main(["router=session", "--cases", "2", "--no-real-model"]) == 0
    assert "router=session: PASS (2 random scenarios)" in capsys.readouterr().out


class _Base(Router):
    def holding(self, replicas):
        return [v for v in replicas if v.can_hold]


class Returns99(_Base):
    name = "returns_99"

    def route(self, request, replicas, now):
        return 99


class ReturnsNone(_Base):
    name = "returns_none"

    def route(self, request, replicas, now):
        return None


class IgnoresCanHold(_Base):
    """Least outstanding over every offered replica, whether it can hold the request or not."""

    name = "ignores_can_hold"

    def route(self, request, replicas, now):
        return min(replicas, key=lambda v: (v.num_outstanding, v.index)).index


class GlobalCounter(_Base):
    """Round robin on a counter shared by every instance: a fresh router goes on where the last stopped."""

    name = "global_counter"
    turns = itertools.count()

    def route(self, request, replicas, now):
        holding = self.holding(replicas)
        return holding[next(self.turns) % len(holding)].index


class FirstThatHolds(_Base):
    name = "first_that_holds"

    def route(self, request, replicas, now):
        return self.holding(replicas)[0].index


class WholeCluster(_Base):
    """Fewest placements of its own over every replica of the cluster, not the pool offered."""

    name = "whole_cluster"

    def __init__(self, config, context):
        super().__init__(config, context)
        self.placed = {v.index: 0 for v in context.replicas}

    def route(self, request, replicas, now):
        cannot = {v.index for v in replicas if not v.can_hold}
        chosen = min((i for i in self.placed if i not in cannot), key=lambda i: (self.placed[i], i))
        self.placed[chosen] += 1
        return chosen


class Clairvoyant(_Base):
    """Reads the whole workload (here: the kit's scenario, from the caller's frame) and places by its size."""

    name = "clairvoyant"

    def route(self, request, replicas, now):
        frame = sys._getframe(1)
        while "scenario" not in frame.f_locals:
            frame = frame.f_back
        holding = self.holding(replicas)
        return holding[(len(frame.f_locals["scenario"].events) + int(request.id[1:])) % len(holding)].index


class FinishRaises(FirstThatHolds):
    name = "finish_raises"

    def route(self, request, replicas, now):
        return min(self.holding(replicas), key=lambda v: (v.num_outstanding, v.index)).index

    def on_finish(self, request, replica):
        raise KeyError(request.id)


class _Broken:
    @hookimpl
    def servelab_register_routers(self):
        return [Returns99, ReturnsNone, IgnoresCanHold, GlobalCounter, FirstThatHolds, WholeCluster, Clairvoyant,
                FinishRaises]


@pytest.fixture(scope="module")
def registry():
    pm = servelab_plugin_manager()  # the built-in policies and executors
    pm.register(_Broken())
    return build_registry(pm)


@pytest.mark.parametrize("name, contract", [
    ("returns_99", "offered replica"),
    ("returns_none", "placed once"),
    ("ignores_can_hold", "can hold"),
    ("global_counter", "deterministic"),
    ("first_that_holds", "spreads load"),
    ("whole_cluster", "both pools"),
    ("clairvoyant", "causal"),
    ("finish_raises", "on_finish"),
])
def test_a_broken_router_is_caught_naming_the_contract(registry, name, contract):
    report = check_plugin("router", name, registry=registry, cases=12, max_failures=1)
    assert report.contracts_broken == [contract], str(report)
    text = str(report)
    assert f"router={name}: FAIL" in text and f"contract broken: {contract}" in text
    if contract == "spreads load":
        assert f"[{SPREAD_REQUESTS}, 0, 0, 0]" in text and "75% of 64 requests" in text
    else:
        assert "router scenario seed=" in text and "router_scenario(" in text
