"""A KV tier shared by a simulated cluster's replicas (kv_tiers.tiers.<i>.shared=true), and the tier
figures of a cluster's summary.json."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from conftest import compose
from servelab.core.errors import ConfigError
from servelab.cluster.build import build_cluster, validate_cluster
from servelab.kv.tiers.shared import SharedTieredKVConnector
from servelab.run.session import run_job
from servelab.assemble.stack import build_stack

# 70B at TP 4 on two replicas whose GPU pools are far below the chats' working set; round_robin sends a
# conversation's turns to alternating replicas, so only a shared tier can serve a turn from the last one
CHAT = ("backend=sim", "model=llama3_70b", "tensor_parallel_size=4", "hardware=h100", "workload=chat_sessions",
        "workload.num_sessions=16", "num_kv_blocks=300", "logger=none", "cluster.replicas=2", "router=round_robin",
        "kv_tiers=host")


def _run(tmp_path, name, *overrides):
    out = tmp_path / name
    run_job(compose(*CHAT, *overrides), out)
    return json.loads((out / "summary.json").read_text()), (out / "requests.jsonl").read_bytes()


def _finished(digests, block_size):
    """A sequence whose blocks are ``digests`` (its ``block_hashes``), all computed, one token after them."""
    n = len(digests) * block_size
    return SimpleNamespace(id="r", num_computed_tokens=n, num_preemptions=0, block_hashes=list(digests),
                           token_ids=[0] * (n + 1), num_tokens=n + 1)


@pytest.mark.parametrize("shared", [True, False])
def test_a_prefix_one_replica_stored_is_loaded_by_another_only_when_shared(shared):
    cfg = compose(*CHAT, "kv_tier_policy=write_through", f"kv_tiers.tiers.0.shared={str(shared).lower()}")
    cluster, stacks = build_cluster(cfg)
    first, second = (s.engine.connector for s in stacks)
    assert isinstance(first, SharedTieredKVConnector) == shared
    digests = [bytes([i]) * 16 for i in range(3)]
    seq = _finished(digests, first.block_size)
    first.request_finished(seq, [0, 1, 2])  # write-through: replica 0 stores the prompt's blocks
    seq.num_computed_tokens = 0  # the same prompt, new on the other replica
    tokens, _ = second.get_num_new_matched_tokens(seq, 0)
    assert tokens == (3 * first.block_size if shared else 0)
    if shared:
        second.update_state_after_alloc(seq, [5, 6, 7], tokens)
        assert second.hit_blocks == [3] and first.written_blocks == [3] and second.written_blocks == [0]
        assert first.blocks[0] is second.blocks[0] and first.leaked() == second.leaked() == 0
    for stack in stacks:
        stack.executor.shutdown()


def test_a_shared_tier_is_priced_over_the_inter_node_link():
    cfg = compose(*CHAT, "kv_tier_policy=write_back", "kv_tiers.tiers.0.shared=true", "kv_tiers.tiers.0.read_gb_s=80")
    _, stacks = build_cluster(cfg)
    spec, = stacks[0].engine.connector.tiers
    # h100: a 50 GB/s NIC per GPU, 20 us per RDMA transfer; the host's 25 GB/s write is the slower end
    assert (spec.read_gb_s, spec.write_gb_s, spec.latency_us) == (50.0, 25.0, 30.0)
    for stack in stacks:
        stack.executor.shutdown()


def test_a_shared_tier_serves_turns_across_replicas_counted_once_and_deterministically(tmp_path):
    own, _ = _run(tmp_path, "own", "kv_tier_policy=write_through")
    shared, records = _run(tmp_path, "shared", "kv_tier_policy=write_through", "kv_tiers.tiers.0.shared=true")
    again, records_again = _run(tmp_path, "again", "kv_tier_policy=write_through", "kv_tiers.tiers.0.shared=true")
    assert records == records_again
    assert {k: v for k, v in shared.items() if k != "wall_time_s"} == {k: v for k, v in again.items()
                                                                        if k != "wall_time_s"}
    (mine,), (ours,) = own["kv_tiers"], shared["kv_tiers"]
    assert not mine["shared"] and ours["shared"]
    assert mine["capacity_blocks"] == 2 * ours["capacity_blocks"]  # a replica's own tier each, one store
    assert ours["max_held_blocks"] <= ours["capacity_blocks"]
    assert shared["kv_tier_hit_rate"] > own["kv_tier_hit_rate"]
    assert shared["prefill_tokens_computed"] < own["prefill_tokens_computed"]
    assert shared["kv_tier_books_broken"] == 0 and shared["leaked_blocks"] == 0
    assert shared["num_finished"] == shared["num_requests"]


def test_a_cluster_summary_states_its_tiers_summed_and_each_replicas_hit_rate(tmp_path):
    summary, _ = _run(tmp_path, "wb", "kv_tier_policy=write_back", "kv_tiers.tiers.0.capacity_gib=1")
    host, = summary["kv_tiers"]
    per = summary["per_replica"]
    assert host["hit_blocks"] > 0 and host["read_bytes"] == host["hit_blocks"] * summary["bytes_per_block"]
    assert summary["kv_tier_host_hit_rate"] == host["hit_rate"] == summary["kv_tier_hit_rate"] > 0
    assert all(0 <= p["kv_tier_hit_rate"] <= 1 for p in per) and len(per) == 2
    assert min(p["kv_tier_hit_rate"] for p in per) <= host["hit_rate"] <= max(p["kv_tier_hit_rate"] for p in per)
    split = summary["kv_tier_ttft_split_ms"]
    assert split["queueing"] + split["load"] + split["prefill_and_rest"] == pytest.approx(summary["ttft_ms"]["mean"])


def test_a_cluster_summary_sums_its_replicas_prefetches(tmp_path):
    summary, _ = _run(tmp_path, "pf", "kv_tier_policy=write_back_prefetch", "kv_tiers.load=serialize")
    keys = ("kv_tier_prefetch_blocks", "kv_tier_prefetch_used_blocks", "kv_tier_prefetch_wasted_blocks")
    assert all(key in summary for key in keys)
    assert summary["kv_tier_prefetch_blocks"] == summary["kv_tier_prefetch_used_blocks"] + \
        summary["kv_tier_prefetch_wasted_blocks"]


def test_a_cluster_without_tiers_states_no_tier_figures(tmp_path):
    summary, _ = _run(tmp_path, "plain", "kv_tiers=none", "kv_tier_policy=none")
    assert "kv_tiers" not in summary and all("kv_tier_hit_rate" not in p for p in summary["per_replica"])


@pytest.mark.parametrize("overrides, words", [
    (("backend=torch", "model=tiny_code"), "kv_tiers.tiers.0.shared=true with backend=torch"),
    (("cluster.replicas=1",), "a single-engine run has no replicas to share a tier with"),
])
def test_a_shared_tier_off_the_simulated_cluster_is_one_line(overrides, words):
    cfg = compose(*CHAT, "kv_tier_policy=write_back", "kv_tiers.tiers.0.shared=true", *overrides)
    with pytest.raises(ConfigError) as err:
        build_stack(cfg) if cfg.cluster.replicas == 1 else validate_cluster(cfg)
    assert words in str(err.value) and "\n" not in str(err.value)


def test_the_cluster_study_runs_and_states_findings_with_numbers():
    import importlib.util
    import re

    from conftest import REPO

    spec = importlib.util.spec_from_file_location("kv_tiers_cluster_study",
                                                  REPO / "experiments" / "kv_tiers" / "cluster_study.py")
    study = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(study)
    res = study.study(sessions=12, num_kv_blocks=300)
    assert len(res["rows"]) == 6 and {r["router"] for r in res["rows"]} == {"round_robin", "prefix_affinity"}
    assert all(r["tier_hit"] is None or len(r["replica_tier_hit"]) == 4 for r in res["rows"])
    findings = study.page(res, 1.0, "python experiments/kv_tiers/cluster_study.py").split("## Findings")[1]
    assert len(re.findall(r"\d+\.\d", findings.split("##")[0])) >= 5
