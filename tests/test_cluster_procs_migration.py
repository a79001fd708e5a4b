"""Live migration on a real engine-process cluster (issue 45, item 5): ``cluster.replicas=2`` on the
real backend with a migration policy moves requests mid-decode between the processes, their KV read
from one pool and written into the other, and every request's greedy tokens equal one engine's; none
is lost or ends twice; the summary carries the simulator's migration keys with measured values. The
policy runs in the parent, so a test policy registered here is enough (the processes need none).

Which requests move, and whether one ends before its move completes, is the wall clock's: the tests
assert tokens and books, and that a migration completed where the requests run far longer than one."""

from __future__ import annotations

import json
import multiprocessing
from pathlib import Path

import pytest

from servelab import hookimpl
from servelab.api import LLM, compose
from servelab.core.errors import ConfigError
from servelab.core.migration_policy import Migrate, MigrationPolicy
from servelab.run.cluster_run import run_cluster_job
from servelab.testing import registry_with

# tiny_code, four requests arriving at once, greedy, long enough outputs that a move lands mid-decode
SMALL = ["model=tiny_code", "workload.num_requests=4", "workload.rate=50", "workload.max_tokens=48"]
KEYS = ("num_migrations", "num_requests_migrated", "migrated_bytes", "migration_downtime_ms",
        "num_aborted_migrations", "aborted_migrations")


class MoveOffOne(MigrationPolicy):
    """Moves each request decoding on replica 1 (two tokens out) to replica 0, once."""

    name = "move_off_one"

    def __init__(self, config, context) -> None:
        super().__init__(config, context)
        self.moved: set[str] = set()

    def decide(self, replicas, now):
        moves = [Migrate(q.id, 0) for q in replicas[1].running
                 if q.id not in self.moved and not q.migrating and q.num_output_tokens >= 2]
        self.moved.update(m.request_id for m in moves)
        return moves


class _Plugins:
    @hookimpl
    def servelab_register_migration_policies(self):
        return [MoveOffOne]


def _records(out: Path) -> list[dict]:
    return list(map(json.loads, (out / "requests.jsonl").open()))


def _tokens(out: Path) -> dict[str, list[int]]:
    return {r["id"]: r["output_token_ids"] for r in _records(out)}


def _summary(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text())


def test_engine_processes_migrate_requests_mid_decode_with_one_engines_tokens(tmp_path):
    LLM(SMALL, logger="none", progress=False).run(tmp_path / "one")
    registry = registry_with(_Plugins())
    cfg = compose([*SMALL, "cluster.replicas=2", "router=round_robin", "migration_policy=move_off_one",
                   "cluster.migration_interval_s=0.01"], logger="none", progress=False)
    run_cluster_job(cfg, tmp_path / "moved", registry=registry)
    assert _tokens(tmp_path / "moved") == _tokens(tmp_path / "one")
    records = _records(tmp_path / "moved")
    assert sorted(r["id"] for r in records) == sorted(_tokens(tmp_path / "one"))  # each once: none lost or twice
    assert all(r["finish_reason"] == "length" for r in records)
    s = _summary(tmp_path / "moved")
    assert s["status"] == "completed" and s["migration_policy"] == "move_off_one" and s["leaked_blocks"] == 0
    assert set(KEYS) <= set(s)
    assert 1 <= s["num_migrations"] == s["num_requests_migrated"] <= 2  # replica 1 had two of the four
    assert s["num_migrations"] + s["num_aborted_migrations"] <= 2  # each asked once (one may end first)
    assert s["migrated_bytes"] > 0 and s["migration_downtime_ms"]["p50"] > 0
    per = s["per_replica"]
    assert sum(p["output_tokens"] for p in per) == s["output_tokens"]  # each token counted where it was made
    assert per[0]["num_requests"] == 2 + s["num_migrations"]  # placed there, and moved there
    assert not list(multiprocessing.active_children())


@pytest.mark.slow
def test_drain_empties_a_replica_of_engine_processes_with_one_engines_tokens(tmp_path):
    """``migration_policy=drain cluster.draining=[1]``: from ``drain_from_s`` replica 1 takes nothing
    new and its running requests move to replica 0."""
    many = ["model=tiny_code", "workload.num_requests=8", "workload.rate=40", "workload.max_tokens=96"]
    LLM(many, logger="none", progress=False).run(tmp_path / "one")
    LLM([*many, "cluster.replicas=2", "router=round_robin", "migration_policy=drain", "cluster.draining=[1]",
         "cluster.drain_from_s=0.15", "cluster.migration_interval_s=0.02", "migration_policy.per_replica=4"],
        logger="none", progress=False).run(tmp_path / "drained")
    assert _tokens(tmp_path / "drained") == _tokens(tmp_path / "one")
    s = _summary(tmp_path / "drained")
    assert s["status"] == "completed" and s["leaked_blocks"] == 0 and s["num_migrations"] >= 1
    assert len(_records(tmp_path / "drained")) == 8


def test_what_migration_on_engine_processes_cannot_do_is_refused_in_one_line(tmp_path):
    with pytest.raises(ConfigError, match="^migration_policy=drain on engine processes moves a request's KV from one "
                                          "worker's pool"):
        LLM([*SMALL, "cluster.replicas=2", "migration_policy=drain", "tensor_parallel_size=2"], logger="none",
            progress=False).run(tmp_path)
    with pytest.raises(ConfigError, match="^migration_policy=llumnix with a real model moves real KV between engine "
                                          "processes on the wall clock: drop clock=virtual"):
        LLM([*SMALL, "cluster.replicas=2", "migration_policy=llumnix", "clock=virtual", "time_model=roofline"],
            logger="none", progress=False)
    assert not list(multiprocessing.active_children())
