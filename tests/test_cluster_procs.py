"""Real clusters on the wall clock (issue 37, items 2 and 3): ``cluster.replicas=2`` on the real
backend runs two engine processes behind the router, and ``cluster.prefill_replicas=1
cluster.decode_replicas=1`` moves each prompt's KV from the prefill process to the decode process;
greedy tokens equal one engine's, the summary has the simulator cluster's keys, a replica that dies
stops the run in one line with partial results, mismatched pools are refused before any process
starts."""

from __future__ import annotations

import json
import multiprocessing
import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from servelab import hookimpl
from servelab.api import LLM, compose
from servelab.core.errors import ConfigError
from servelab.core.interfaces import Router, RouterError
from servelab.core.request import Request
from servelab.cluster.build import kv_bytes_per_token
from servelab.run.cluster_run import run_cluster_job
from servelab.cluster.procs.cluster import ReplicaProcessError
from servelab.assemble.executor import model_shape
from servelab.testing import registry_with

ROOT = Path(__file__).resolve().parent.parent
# tiny_code (the shipped trained model), a few requests arriving at once, greedy; ~10 s a cluster run
SMALL = ["model=tiny_code", "workload.num_requests=6", "workload.rate=50", "workload.max_tokens=24"]
PD = ["cluster.prefill_replicas=1", "cluster.decode_replicas=1"]


def _tokens(out: Path) -> dict[str, list[int]]:
    return {r["id"]: r["output_token_ids"] for r in map(json.loads, (out / "requests.jsonl").open())}


def _summary(out: Path) -> dict:
    return json.loads((out / "summary.json").read_text())


@pytest.fixture(scope="module")
def one_engine(tmp_path_factory) -> dict[str, list[int]]:
    out = tmp_path_factory.mktemp("one")
    LLM(SMALL, logger="none", progress=False).run(out)
    return _tokens(out)


@pytest.fixture(scope="module")
def two_replicas(tmp_path_factory) -> Path:
    """``python run.py cluster.replicas=2 router=round_robin model=tiny_code`` (a smaller workload)."""
    out = tmp_path_factory.mktemp("two")
    done = subprocess.run([sys.executable, str(ROOT / "run.py"), *SMALL, "cluster.replicas=2", "router=round_robin",
                           "logger=none", "progress=false", f"hydra.run.dir={out}"], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return out


@pytest.fixture(scope="module")
def prefill_decode(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("pd")
    LLM([*SMALL, *PD], logger="none", progress=False).run(out)
    return out


def test_two_engine_processes_give_one_engines_tokens_and_per_replica_figures(two_replicas, one_engine):
    assert _tokens(two_replicas) == one_engine
    s = _summary(two_replicas)
    assert s["status"] == "completed" and s["clock"] == "wall"
    assert (s["router"], s["num_replicas"], s["num_kv_transfers"]) == ("round_robin", 2, 0)
    per = s["per_replica"]
    assert [p["num_requests"] for p in per] == [3, 3]  # round robin over six requests
    assert all(p["num_steps"] > 0 and p["output_tokens"] > 0 for p in per)
    assert sum(p["output_tokens"] for p in per) == s["output_tokens"]
    assert s["leaked_blocks"] == 0
    assert "num_migrations" not in s and "migration_policy" not in s  # migration_policy=none: today's summary


def test_prefill_decode_processes_move_the_kv_and_give_one_engines_tokens(prefill_decode, one_engine):
    assert _tokens(prefill_decode) == one_engine
    s = _summary(prefill_decode)
    cfg = compose([*SMALL, *PD], logger="none", progress=False)
    records = list(map(json.loads, (prefill_decode / "requests.jsonl").open()))
    handed = [r for r in records if r["output_len"] > 1]
    assert s["num_kv_transfers"] == len(handed) > 0
    assert s["kv_transfer_bytes"] == sum(r["prompt_len"] for r in handed) * kv_bytes_per_token(cfg, model_shape(cfg))
    assert 0 < s["kv_transfer_s"] <= s["kv_transfer_exposed_s"] + 1e-3 * len(handed)
    prefill, decode = s["per_replica"]
    assert (prefill["role"], decode["role"]) == ("prefill", "decode")
    assert prefill["output_tokens"] == len(records)  # the first token of each
    assert decode["output_tokens"] == s["output_tokens"] - len(records)
    assert s["leaked_blocks"] == 0


def test_mismatched_pools_are_refused_in_one_line_naming_both(tmp_path):
    with pytest.raises(ConfigError, match=r"prefill replicas \(.*block_size=16\).*decode replicas \(.*block_size=32\)"):
        LLM([*SMALL, *PD, "cluster.decode.block_size=32"], logger="none", progress=False).run(tmp_path)
    assert not list(multiprocessing.active_children())


def test_what_engine_processes_cannot_do_is_refused_in_one_line(tmp_path):
    with pytest.raises(ConfigError, match="drop clock=virtual"):
        LLM([*SMALL, *PD, "clock=virtual", "time_model=roofline"], logger="none", progress=False)
    with pytest.raises(ConfigError, match="^strict_requests=true checks every request against one engine"):
        LLM([*SMALL, "cluster.replicas=2", "strict_requests=true"], logger="none", progress=False).run(tmp_path)


class KillsReplicaOne(Router):
    """Round robin that kills replica 1's process when it places the third request."""

    name = "kills_replica_one"
    placed = 0

    def route(self, request, replicas, now):
        KillsReplicaOne.placed += 1
        if KillsReplicaOne.placed == 3:
            for child in multiprocessing.active_children():
                if child.name == "servelab-replica1":
                    os.kill(child.pid, signal.SIGKILL)
        return replicas[KillsReplicaOne.placed % len(replicas)].index


class Returns99(Router):
    name = "returns_99"

    def route(self, request, replicas, now):
        return 99


class _Plugins:
    @hookimpl
    def servelab_register_routers(self):
        return [KillsReplicaOne, Returns99]


def test_a_replica_that_dies_stops_the_run_in_one_line_and_partial_results_are_written(tmp_path):
    registry = registry_with(_Plugins())
    cfg = compose([*SMALL, "cluster.replicas=2", "router=kills_replica_one"], logger="none", progress=False)
    with pytest.raises(ReplicaProcessError, match=r"^replica 1 \(mixed, pid \d+\) died \(killed by SIGKILL\)$"):
        run_cluster_job(cfg, tmp_path, registry=registry)
    s = _summary(tmp_path)
    assert s["status"].startswith("failed: ReplicaProcessError: replica 1")
    records = list(map(json.loads, (tmp_path / "requests.jsonl").open()))
    assert len({r["id"] for r in records}) == len(records) >= 3  # those placed: ended, or written unfinished
    assert s["per_replica"][1]["num_steps"] == 0  # no report from the dead; replica 0 was told to stop at once
    assert not list(multiprocessing.active_children())


def test_closed_loop_clients_send_through_the_engine_processes(tmp_path, one_engine):
    LLM([*SMALL, *PD, "workload.arrival=closed_loop", "workload.concurrency=2"], logger="none",
        progress=False).run(tmp_path)
    assert _tokens(tmp_path) == one_engine
    records = list(map(json.loads, (tmp_path / "requests.jsonl").open()))
    spans = [(r["arrival_s"], r["arrival_s"] + r["e2e_ms"] / 1e3) for r in records]
    assert max(sum(a <= t < b for a, b in spans) for t, _ in spans) == 2  # two clients: never three in flight
    assert sum(r["arrival_s"] == 0.0 for r in records) == 2  # the rest were sent when one ended


def test_a_router_that_returns_no_offered_replica_stops_the_run_naming_the_plugin(tmp_path):
    cfg = compose([*SMALL, "cluster.replicas=2", "router=returns_99"], logger="none", progress=False)
    with pytest.raises(RouterError, match=r"^router plugin 'returns_99' returned 99 for request 'corpus-0'"):
        run_cluster_job(cfg, tmp_path, registry=registry_with(_Plugins()))
    assert _summary(tmp_path)["status"].startswith("failed: RouterError")
    assert not list(multiprocessing.active_children())  # the engine processes were stopped


def test_a_prefix_the_decode_replica_caches_is_not_written_again_and_tokens_stay_equal(tmp_path):
    rng = random.Random(1)
    shared = [rng.randrange(32, 127) for _ in range(48)]  # three blocks the decode replica caches after the first
    requests = [Request(id=f"p{i}", prompt_token_ids=tuple(shared + [rng.randrange(32, 127) for _ in range(5 + i)]),
                        max_tokens=8, arrival_time=0.3 * i) for i in range(4)]
    cached = ["model=tiny_code", "allocator.prefix_caching=true"]
    LLM(cached, logger="none", progress=False).run(tmp_path / "one", requests=requests)
    LLM([*cached, *PD], logger="none", progress=False).run(tmp_path / "pd", requests=requests)
    assert _tokens(tmp_path / "pd") == _tokens(tmp_path / "one")
    decode = _summary(tmp_path / "pd")["per_replica"][1]
    assert decode["prefix_cache_hit_rate"] > 0  # the later prompts' shared blocks were not written again
