"""The kit's migration contracts (servelab.kit.conformance_migration): they pass for every built-in
policy, and catch a mechanism that loses, duplicates or alters a migrated request."""

from __future__ import annotations

import pytest

from servelab.kit.conformance_migration import cluster_problem, outcome_of
from servelab.testing import check_plugin

from test_migration import Scripted, cluster_of, requests

SCRIPT = [("r0", 1), ("r2", 1), ("r1", 0)]


def make_with(patch=None):
    def make():
        cluster = cluster_of("migration_policy=drain", "cluster.migration_interval_s=0.5")
        cluster.migration.policy = Scripted(SCRIPT)
        if patch is not None:
            patch(cluster.migration)
        return cluster
    return make


@pytest.fixture(scope="module")
def reference():
    reqs = requests()
    outcome, problem = outcome_of(cluster_of(), reqs)
    assert problem is None and outcome is not None
    return reqs, outcome[0]


def test_the_mechanism_keeps_every_contract(reference):
    reqs, expected = reference
    assert cluster_problem(make_with(), reqs, expected, "scripted") == (None, 3)


def lose(driver):
    """Lands a migration without giving the target the request."""
    def land(m, t):
        m.target.engine.allocator.free(m.shadow)
        driver.protocol.migrate(m.seq, m.target)
        del driver.active[m.seq.id]
    driver._land = land


def duplicate(driver):
    """Copies the KV and starts the request on the target, but never stops it on the source."""
    def stop(m, now):
        m.stop_s = now
        driver._land(m, now + 1e-3)
    driver._stop = stop


def alter(driver):
    """Gives the target the request with its last token changed (what a copy of the wrong blocks does)."""
    land = driver._land

    def altered_land(m, t):
        m.seq.output_token_ids[-1] += 1
        land(m, t)
    driver._land = altered_land


@pytest.mark.parametrize("double, contracts", [(lose, {"one replica", "none lost or twice"}),
                                               (duplicate, {"one replica", "none lost or twice"}),
                                               (alter, {"tokens equal"})])
def test_a_mechanism_that_loses_duplicates_or_alters_a_request_is_caught(reference, double, contracts):
    reqs, expected = reference
    problem, _ = cluster_problem(make_with(double), reqs, expected, "scripted")
    assert problem is not None and problem[0] in contracts, problem


@pytest.mark.slow
@pytest.mark.parametrize("name", ["none", "drain", "llumnix"])
def test_every_builtin_passes_the_kit(name):
    report = check_plugin("migration_policy", name)
    assert report.ok, report


def test_llumnix_passes_the_kit_and_moves_requests():  # the fast twin: one built-in that moves
    report = check_plugin("migration_policy", "llumnix")
    assert report.ok, report
    assert not any("moved nothing" in n for n in report.notes)
