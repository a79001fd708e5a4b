"""``servelab check-plugin kv_tier_policy=<name>``: the built-ins pass, broken policies are named."""

from __future__ import annotations

import random
import sys

import pytest

from servelab.kit.conformance_kv_tiers import _replay
from servelab.plugin_api import KVTierPolicy, hookimpl
from servelab.testing import check_plugin, registry_with


class LosesTrack(KVTierPolicy):
    """Names a victim the full tier does not hold."""

    name = "loses_track"

    def victim(self, tier, blocks):
        return b"not a block"


class DemotesUp(KVTierPolicy):
    """Moves a victim to the tier it came from."""

    name = "demotes_up"

    def demote(self, tier, block):
        return tier


class Unseeded(KVTierPolicy):
    """Picks victims at random from a generator it never seeds from the context."""

    name = "unseeded"

    def __init__(self, config, context):
        super().__init__(config, context)
        self.rng = random.Random()

    def victim(self, tier, blocks):
        return self.rng.choice(list(blocks))


@hookimpl
def servelab_register_kv_tier_policies():
    return [LosesTrack, DemotesUp, Unseeded]


@pytest.fixture(scope="module")
def registry():
    return registry_with(sys.modules[__name__])


@pytest.mark.parametrize("name", ["none", "write_back", "write_through", "reuse_aware", "write_back_prefetch"])
def test_every_builtin_passes(name):
    report = check_plugin("kv_tier_policy", name, cases=2)
    assert report.ok, str(report)


@pytest.mark.parametrize("name, contract", [("loses_track", "valid answers"), ("demotes_up", "valid answers"),
                                            ("unseeded", "deterministic")])
def test_a_broken_policy_is_named(registry, name, contract):
    report = check_plugin("kv_tier_policy", name, registry=registry, cases=1)
    assert report.contracts_broken == [contract], str(report)
    assert name in str(report) or contract == "deterministic"


def test_the_ledger_catches_a_load_of_a_dropped_block_and_an_overfull_tier():
    d = b"d"
    assert _replay([("store", 0, d), ("drop", 0, d), ("load", 0, d)], [2])[0] == "loads return the stored blocks"
    assert _replay([("store", 0, b"a"), ("store", 0, b"b")], [1])[0] == "capacities respected"
    assert _replay([("store", 0, d), ("move", 0, d, 1), ("load", 1, d)], [1, 1]) is None


def test_the_ledger_catches_a_prefetch_from_a_tier_that_does_not_hold_the_block():
    d = b"d"
    assert _replay([("store", 0, d), ("move", 0, d, 1), ("prefetch", 0, d)], [1, 1])[0] == \
        "prefetches read stored blocks"
    assert _replay([("store", 0, d), ("prefetch", 0, d), ("load", 0, d)], [1]) is None


@pytest.mark.slow  # five simulated runs of tier_chat: about 35 s on 2 shared cores
def test_grade_scores_a_policy_against_write_back_on_a_multi_turn_workload():
    from servelab.kit.grading import grade

    result = grade("kv_tier_policy", "reuse_aware")
    scores = {row.policy: row.score for row in result.rows}
    assert set(scores) == {"reuse_aware", "none", "write_back", "write_through", "write_back_prefetch"}
    assert scores["write_back"] == 1.0 and scores["none"] < 1.0  # storing nothing loses to the tiers
    # ... to every policy that stores, though it has the lowest TTFT p99 there (the score reads the mean)
    rows = {row.policy: row for row in result.rows}
    assert rows["none"].ttft_p99_ms < rows["write_back"].ttft_p99_ms
    assert scores["none"] < min(score for policy, score in scores.items() if policy != "none")
    assert rows["none"].tier_hit_rate == 0 < rows["write_back"].tier_hit_rate
    assert {row.workload for row in result.rows} == {"tier_chat"}
