"""Live migration on the simulator's cluster (servelab.cluster.migration): a moved request's tokens,
count and KV accounting are those of a run without migration; pre-copy keeps the downtime to the
last stage; a migration that cannot finish is aborted with the request still running on its source;
``migration_policy=none`` builds nothing; bad answers and bad keys are one line."""

from __future__ import annotations

import pytest

from servelab.api import compose
from servelab.cluster.build import build_cluster
from servelab.core.contexts import MigrationPolicyContext
from servelab.core.errors import ConfigError
from servelab.core.migration_policy import (Migrate, MigrationPolicy, MigrationPolicyError, ReplicaLoad,
                                            RequestLoad, checked_decisions)
from servelab.core.request import Request
from servelab.kv.link import KVLink

SIM = ["backend=sim", "model=llama3_8b", "hardware=h100", "block_size=16"]


def cluster_of(*overrides: str, replicas: int = 2):
    cfg = compose([*SIM, f"cluster.replicas={replicas}", *overrides], logger="none", progress=False)
    cluster, stacks = build_cluster(cfg)
    return cluster


class Scripted(MigrationPolicy):
    """Moves each ``(request id, target)`` of ``script`` at the first tick it is running elsewhere."""

    name = "scripted"

    def __init__(self, script: list[tuple[str, int]]) -> None:
        super().__init__(None, MigrationPolicyContext(3))
        self.script = list(script)

    def decide(self, replicas, now):
        running = {q.id: r.index for r in replicas for q in r.running if not q.migrating}
        moves = [Migrate(rid, t) for rid, t in self.script if running.get(rid, t) != t]
        self.script = [(rid, t) for rid, t in self.script if Migrate(rid, t) not in moves]
        return moves


def run(cluster, requests, policy=None):
    """Run ``requests`` (``policy`` replacing the cluster's migration policy); their final sequences."""
    if policy is not None:
        cluster.migration.policy = policy
    ended = []
    cluster.request_listeners.append(ended.append)
    cluster.run(requests)
    return ended


def outputs(ended) -> dict[str, tuple]:
    return {s.id: (tuple(s.output_token_ids), s.finish_reason) for s in ended}


def requests(n: int = 6, out: int = 300, prompt: int = 200) -> list[Request]:
    return [Request(f"r{i}", tuple(range(1 + 1000 * i, 1 + 1000 * i + prompt)), out, arrival_time=0.01 * i)
            for i in range(n)]


def leaked(cluster) -> int:
    return sum(r.engine.allocator.leaked_blocks() for r in cluster.replicas)


# ---- a moved request is the request it was --------------------------------------------------------
def test_a_migrated_request_has_the_tokens_count_and_kv_of_a_run_without_migration():
    reqs = requests()
    base = outputs(run(cluster_of("router=round_robin"), reqs))
    cluster = cluster_of("router=round_robin", "migration_policy=drain", "cluster.migration_interval_s=0.5")
    ended = run(cluster, reqs, Scripted([("r0", 1), ("r2", 1), ("r1", 0)]))
    assert outputs(ended) == base
    assert len(ended) == len(reqs) and len({s.id for s in ended}) == len(reqs)  # none lost, none twice
    sums = cluster.migration.sums
    assert {m.request_id for m in sums.done} == {"r0", "r1", "r2"} and not sums.aborted
    assert leaked(cluster) == 0 and not cluster.migration.active
    for m in sums.done:  # every token's KV but the last moved; the bytes are those tokens'
        final = next(s for s in ended if s.id == m.request_id)
        assert 200 < m.num_tokens < final.num_tokens
        assert m.nbytes == pytest.approx(m.num_tokens * cluster.migration.links.kv_bytes_per_token)
    per = [r.output_tokens for r in cluster.replicas]  # each output token counted once, where it was made
    assert sum(per) == sum(len(s.output_token_ids) for s in ended)
    assert sum(r.prompt_tokens for r in cluster.replicas) == sum(r.prompt_len for r in reqs)


def test_migration_runs_are_deterministic():
    reqs = requests()
    runs = []
    for _ in range(2):
        cluster = cluster_of("migration_policy=drain", "cluster.draining=[0]", "cluster.drain_from_s=0.5")
        ended = run(cluster, reqs)
        runs.append(([(s.id, tuple(s.token_times)) for s in ended], [vars(m) for m in cluster.migration.sums.done]))
    assert runs[0] == runs[1] and runs[0][1]


def test_drain_empties_a_draining_replica_and_the_router_places_nothing_there():
    reqs = requests(8) + [Request("late", tuple(range(5, 105)), 50, arrival_time=1.0)]
    base = outputs(run(cluster_of(), reqs))
    cluster = cluster_of("migration_policy=drain", "cluster.draining=[0]", "cluster.drain_from_s=0.5")
    ended = run(cluster, reqs)
    assert outputs(ended) == base
    moved = {m.request_id for m in cluster.migration.sums.done}
    assert moved and all(m.source == 0 for m in cluster.migration.sums.done)
    assert cluster.protocol.draining == {0}


def test_pre_copy_keeps_the_downtime_to_the_last_blocks():
    """A long request moved over a slow link: with pre-copy its stop-and-copy moves a block or so; without,
    all of its KV, and the downtime grows with it."""
    def downtime(precopy: bool):
        cluster = cluster_of(f"cluster.migration_precopy={str(precopy).lower()}", "migration_policy=drain")
        cluster.migration.links.links = {k: KVLink(5e9, 1e-5, 1, "inter_node") for k in cluster.migration.links.links}
        run(cluster, [Request("long", tuple(range(1, 3001)), 400)], Scripted([("long", 1)]))
        (m,) = cluster.migration.sums.done
        return m
    with_, without = downtime(True), downtime(False)
    assert with_.num_stages >= 1 and without.num_stages == 0
    assert with_.downtime_s < without.downtime_s / 10
    assert with_.nbytes >= without.nbytes  # pre-copy sends the stages, then the rest


def test_a_target_without_blocks_aborts_and_the_request_finishes_where_it_was():
    reqs = [Request("small", tuple(range(1, 301)), 200), Request("big", tuple(range(2001, 2401)), 200, 0.001)]
    base = outputs(run(cluster_of("num_kv_blocks=40", "router=round_robin"), reqs))
    cluster = cluster_of("num_kv_blocks=40", "router=round_robin", "migration_policy=drain",
                         "cluster.migration_interval_s=0.2")
    ended = run(cluster, reqs, Scripted([("small", 1)]))  # replica 1 holds "big": no room for "small"
    assert outputs(ended) == base
    assert cluster.migration.sums.aborted == {"target full": 1} and not cluster.migration.sums.done
    assert leaked(cluster) == 0


def test_a_request_that_ends_during_pre_copy_aborts_its_migration():
    reqs = [Request("short", tuple(range(1, 2001)), 40)]
    base = outputs(run(cluster_of(), reqs))
    cluster = cluster_of("migration_policy=drain", "cluster.migration_interval_s=0.1")
    cluster.migration.links.links = {k: KVLink(1e8, 1e-5, 1, "inter_node") for k in cluster.migration.links.links}
    ended = run(cluster, reqs, Scripted([("short", 1)]))
    assert outputs(ended) == base
    assert cluster.migration.sums.aborted == {"finished": 1}
    assert leaked(cluster) == 0 and cluster.replicas[1].engine.allocator.num_used_blocks() == 0


# ---- none is today's cluster ---------------------------------------------------------------------
def test_none_builds_no_driver_and_no_connector():
    cluster = cluster_of()
    assert cluster.migration is None
    assert all(r.engine.connector is None for r in cluster.replicas)  # fast-forward stays on


# ---- checked answers, one-line config errors -------------------------------------------------------
def _loads() -> list[ReplicaLoad]:
    q = RequestLoad("a", 0, 10, 2, 20, 1, 1)
    return [ReplicaLoad(0, "mixed", 10, 16, 1, 9, running=(q,)), ReplicaLoad(1, "mixed", 10, 16, 0, 10, draining=True),
            ReplicaLoad(2, "mixed", 10, 16, 0, 10, waiting=(RequestLoad("w", 2, 10, 0, 20, 0, 1),))]


class Answer(MigrationPolicy):
    name = "answer"

    def __init__(self, answer) -> None:
        super().__init__(None, MigrationPolicyContext(3))
        self.answer = answer

    def decide(self, replicas, now):
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


@pytest.mark.parametrize("answer, says", [
    ([Migrate("zz", 2)], "not running on any replica"),
    ([Migrate("w", 0)], "not running on any replica"),
    ([Migrate("a", 2), Migrate("a", 2)], "migrating already"),
    ([Migrate("a", 7)], "not a replica index"),
    ([Migrate("a", 0)], "runs there already"),
    ([Migrate("a", 1)], "draining"),
    ([("a", 2)], "not a Migrate"),
    (ValueError("boom"), "failed at t=0: ValueError: boom"),
])
def test_a_bad_answer_stops_the_run_naming_the_plugin_and_request(answer, says):
    with pytest.raises(MigrationPolicyError, match="migration_policy plugin 'answer'") as err:
        checked_decisions(Answer(answer), _loads(), 0.0)
    assert says in str(err.value)
    assert checked_decisions(Answer([Migrate("a", 2)]), _loads(), 0.0) == [Migrate("a", 2)]


@pytest.mark.parametrize("overrides, message", [
    (["cluster.migration_interval_s=0", "migration_policy=drain"], "cluster.migration_interval_s=0.0 must be > 0"),
    (["cluster.draining=[5]", "migration_policy=drain"], "cluster.draining=[5]: [5] not replica indices"),
    (["cluster.draining=[0]"], "choose a migration_policy that moves them"),
    (["migration_policy=llumnix", "migration_policy.source_below=9"], "migration_policy=llumnix: "
                                                                       "migration_policy.source_below=9.0"),
])
def test_bad_migration_keys_are_one_line(overrides, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        cluster_of(*overrides)


def test_migration_with_prefill_decode_pools_is_refused():
    cfg = compose([*SIM, "cluster.prefill_replicas=1", "cluster.decode_replicas=1", "migration_policy=llumnix"],
                  logger="none", progress=False)
    with pytest.raises(ConfigError, match="colocated replicas"):
        build_cluster(cfg)


def test_an_interrupted_run_lists_a_request_whose_last_copy_is_on_the_link_once():
    cluster = cluster_of("migration_policy=drain", "cluster.migration_interval_s=0.2")
    cluster.migration.policy = Scripted([("r0", 1)])

    def interrupted(m, t):
        raise RuntimeError("interrupted")
    cluster.migration._land = interrupted
    with pytest.raises(RuntimeError, match="interrupted"):
        cluster.run(requests(2))
    live = [s for s in cluster.live_sequences() if s.id == "r0"]
    assert len(live) == 1 and not live[0].is_finished and live[0].num_output_tokens > 0
