"""scheduler=lpm (longest prefix match first): its order with a scripted cache (fake executor,
virtual clock), the scan window, the starvation bound, the dfs-weight groups, the real prefix
cache, then the tiny real model (tokens equal fcfs's, more cache hits) and the simulator."""

from __future__ import annotations

import json

import pytest

from test_policy_pack_schedulers import admission_order
from test_schedulers import fake_engine, req, run
from servelab.api import compose
from servelab.core.errors import ConfigError
from servelab.core.request import Request
from servelab.plugins.schedulers.lpm import dfs_weight_order
from servelab.run.session import run_job


def script_cache(engine, cached: dict[str, int]) -> None:
    """The allocator answers ``cached[seq.id]`` (0 if absent) for how much of a waiting request it
    holds; nothing is really cached, so only the order changes."""
    engine.scheduler.allocator.cached_prefix_len = lambda seq: cached.get(seq.id, 0)


def tokens(*parts: int, size: int = 4) -> tuple[int, ...]:
    """A prompt of ``size``-token blocks; block ``p`` is the same tokens wherever it appears."""
    return tuple(10 * p + j for p in parts for j in range(size))


# ---- the order ------------------------------------------------------------------------------

def test_admits_the_longest_cached_prefix_first_ties_by_arrival():
    engine, clock = fake_engine("lpm", "max_num_seqs=1")
    script_cache(engine, {"b": 32, "c": 16, "d": 32})
    run(engine, clock, [req(rid, 40, 2) for rid in "abcd"])
    assert admission_order(engine) == ["b", "d", "c", "a"]


def test_the_order_is_re_evaluated_every_step():
    engine, clock = fake_engine("lpm", "max_num_seqs=1")
    cached = {"b": 32, "c": 16}
    script_cache(engine, cached)
    for rid in "abcd":
        engine.add_request(req(rid, 40, 2))
    engine.step()
    cached["d"] = 64  # the cache changed while b ran
    while engine.has_unfinished():
        engine.step()
    assert admission_order(engine) == ["b", "d", "c", "a"]


def test_only_the_max_scan_oldest_are_ranked_the_rest_wait_in_arrival_order():
    requests = [req(f"r{i}", 16, 2) for i in range(5)]
    cached = {"r1": 8, "r4": 64}
    engine, clock = fake_engine("lpm", "max_num_seqs=1", "scheduler.max_scan=2")
    script_cache(engine, cached)
    run(engine, clock, requests)
    # r4 is ranked only once it is among the two oldest waiting
    assert admission_order(engine) == ["r1", "r0", "r2", "r4", "r3"]
    engine, clock = fake_engine("lpm", "max_num_seqs=1", "scheduler.max_scan=5")
    script_cache(engine, cached)
    run(engine, clock, requests)
    assert admission_order(engine) == ["r4", "r1", "r0", "r2", "r3"]


def test_a_request_past_max_wait_s_goes_ahead_of_longer_prefixes():
    hits = [req(f"h{i}", 16, 3, arrival=0.001 * i) for i in range(40)]
    requests = [req("cold", 16, 3), *hits]
    cached = {r.id: 8 for r in hits}
    engine, clock = fake_engine("lpm", "max_num_seqs=1", "scheduler.max_wait_s=null")
    script_cache(engine, cached)
    run(engine, clock, requests)
    assert admission_order(engine)[-1] == "cold"  # starved while requests with hits kept coming
    engine, clock = fake_engine("lpm", "max_num_seqs=1", "scheduler.max_wait_s=0.05")
    script_cache(engine, cached)
    out = run(engine, clock, requests)
    assert admission_order(engine).index("cold") < 10
    started_ms = out["cold"]["queue_ms"]
    held_ms = max(r["e2e_ms"] - r["queue_ms"] for r in out.values())
    assert started_ms <= 50 + held_ms  # the bound, plus a seat freeing up


# ---- groups (dfs-weight) --------------------------------------------------------------------

def test_dfs_weight_order_heavier_subtrees_first_deeper_before_shallower():
    paths = [[1, 2], [1, 3], [1, 2, 5], [], [1, 3], [1, 3]]
    # node 3 holds three requests, node 2 two (the deeper one first); nothing cached comes last
    assert dfs_weight_order(paths) == [1, 4, 5, 2, 0, 3]
    assert dfs_weight_order([[8], [7]]) == [0, 1]  # equal weights: the subtree holding the oldest
    assert dfs_weight_order([[8], [7]], last=[7, 9]) == [1, 0]  # ... unless the request admitted last is in one


def test_group_by_prefix_admits_the_requests_sharing_a_cached_prefix_together():
    # x* share blocks 0 (common to all) and 1; y shares only block 0 but has a longer cached prefix
    requests = [Request("x1", tokens(0, 1, 2), 2), Request("y", tokens(0, 3, 4, 5), 2),
                Request("x2", tokens(0, 1, 6), 2), Request("x3", tokens(0, 1, 7), 2)]
    cached = {"x1": 8, "x2": 8, "x3": 8, "y": 12}
    engine, clock = fake_engine("lpm", "max_num_seqs=1", "block_size=4")
    script_cache(engine, cached)
    run(engine, clock, requests)
    assert admission_order(engine) == ["y", "x1", "x2", "x3"]
    engine, clock = fake_engine("lpm", "max_num_seqs=1", "block_size=4", "scheduler.group_by_prefix=true")
    script_cache(engine, cached)
    run(engine, clock, requests)
    # x3 and y are alone in their subtrees once x1 and x2 run: x2, admitted last, keeps the group going
    assert admission_order(engine) == ["x1", "x2", "x3", "y"]
    assert engine.scheduler._keys == {} and engine.scheduler.waiting._numbers == {}  # nothing kept per request


# ---- the real prefix cache ------------------------------------------------------------------

@pytest.mark.parametrize("scheduler, first", [("fcfs", "old"), ("lpm", "sibling")])
def test_a_request_whose_prefix_is_cached_goes_before_an_older_one_whose_is_not(scheduler, first):
    requests = [Request("warm", tokens(1, 2, 3, 4, 5, 6, 7, 8, 9, size=4), 6),
                Request("old", tokens(20, 21, 22, 23, 24, 25, 26, 27, 28, size=4), 2),
                Request("sibling", tokens(1, 2, 3, 4, 5, 6, 7, 8, 30, size=4), 2)]
    engine, clock = fake_engine(scheduler, "max_num_seqs=1", "block_size=4", "allocator.prefix_caching=true")
    out = run(engine, clock, requests)
    assert admission_order(engine) == ["warm", first, "sibling" if first == "old" else "old"]
    assert out["sibling"]["num_cached_prompt_tokens"] == 32  # warm's 8 shared blocks
    assert out["old"]["num_cached_prompt_tokens"] == 0


@pytest.mark.parametrize("key, value, message", [("max_scan", 0, "scheduler.max_scan=0 must be an integer >= 1"),
                                                 ("max_wait_s", 0, "scheduler.max_wait_s=0.0 must be > 0")])
def test_bad_parameters_are_rejected_naming_the_key(key, value, message):
    with pytest.raises(ConfigError, match=message):
        fake_engine("lpm", f"scheduler.{key}={value}")


# ---- end to end -----------------------------------------------------------------------------

def sibling_trace(path) -> str:
    """A Mooncake-style hash_ids trace: 4 conversations x 3 turns, all arriving at once and
    interleaved (conversation after conversation, turn by turn); each turn shares its
    conversation's 6 leading blocks (block 0 with everybody) and has 2 of its own."""
    rows, own = [], 1000
    for _turn in range(3):
        for conv in range(4):
            ids = [0, *(100 * conv + j for j in range(1, 6)), own, own + 1]
            own += 2
            rows.append({"timestamp": 0, "input_length": 512 * len(ids), "output_length": 256, "hash_ids": ids})
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return str(path)


TINY_TRACE = ["model=tiny", "workload=hash_ids", "workload.num_requests=null", "workload.block_tokens=8",
              "block_size=8", "allocator.prefix_caching=true", "logger=none", "progress=false", "clock=virtual",
              "time_model=profile_small64", "model.hidden_size=64", "model.intermediate_size=128",
              "model.num_hidden_layers=2", "model.num_attention_heads=4", "model.num_key_value_heads=2",
              "max_num_seqs=2", "num_kv_blocks=24"]  # every row arrives at timestamp 0


def test_real_model_tokens_equal_fcfs_and_the_cache_hits_more(tmp_path):
    trace = sibling_trace(tmp_path / "siblings.jsonl")
    results = {s: run_job(compose([*TINY_TRACE, f"workload.path={trace}", f"scheduler={s}"]), tmp_path / s)
               for s in ("fcfs", "lpm")}
    outputs = {s: {r["id"]: r["output_token_ids"] for r in res.requests} for s, res in results.items()}
    assert len(outputs["lpm"]) == 12 and outputs["lpm"] == outputs["fcfs"]
    hit_rate = {s: res.summary["prefix_cache_hit_rate"] for s, res in results.items()}
    # fcfs interleaves the conversations, so a 24-block pool evicts each prefix before its next turn
    assert hit_rate["lpm"] > hit_rate["fcfs"]
    assert all(res.summary["leaked_blocks"] == 0 for res in results.values())


def test_the_simulator_runs_lpm_with_groups_on_the_mooncake_trace(tmp_path):
    cfg = compose(["backend=sim", "model=llama3_70b", "tensor_parallel_size=4", "workload=hash_ids",
                   "workload.num_requests=120", "workload.time_scale=0.05", "allocator.prefix_caching=true",
                   "scheduler=lpm", "scheduler.group_by_prefix=true", "scheduler.max_scan=16", "num_kv_blocks=600",
                   "logger=none", "progress=false"])
    summary = run_job(cfg, tmp_path).summary
    assert summary["num_finished"] == 120 and summary["leaked_blocks"] == 0
    assert summary["prefix_cache_hit_rate"] > 0
