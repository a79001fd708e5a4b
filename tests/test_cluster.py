"""The cluster: one replica is today's engine exactly; N replicas are deterministic and place each
request once; the real tiny model gives one engine's tokens on any replica; prefill/decode
disaggregation prices the KV transfer, puts it in TTFT, and survives back-pressure and
preemption on the decode side; bad input is one line."""

from __future__ import annotations

import json

import pytest

from servelab.api import compose
from servelab.cluster.replica import Replica
from servelab.kv.link import KVLink, schedule_transfer
from servelab.core.errors import ConfigError
from servelab.core.interfaces import RouterError
from servelab.core.shapes import HardwareProfile
from servelab.plugins.routers.round_robin import RoundRobinRouter
from servelab.cluster.build import build_cluster, kv_bytes_per_token
from servelab.run.cluster_run import run_cluster_job
from servelab.run.session import run_job
from servelab.assemble.executor import model_shape

SIM = ["backend=sim", "model=llama3_8b", "hardware=h100", "workload.num_requests=60", "workload.rate=40"]
SIM_70B = ["backend=sim", "model=llama3_70b", "hardware=h100", "tensor_parallel_size=4",
           "workload.num_requests=60", "workload.rate=20"]
CLUSTER_ONLY = {"router", "num_replicas", "num_gpus", "load_imbalance", "num_kv_transfers", "kv_transfer_bytes",
                "kv_transfer_s", "kv_transfer_exposed_s"}


def sim(*overrides: str, base=SIM):
    return compose([*base, *overrides], logger="none", progress=False)


def records(result) -> dict[str, dict]:
    return {r["id"]: r for r in result.requests}


# ---- one replica is today's engine --------------------------------------------------------

def test_one_replica_through_the_cluster_loop_is_todays_engine_exactly(tmp_path):
    today = run_job(sim(), tmp_path / "engine")
    looped = run_cluster_job(sim(), tmp_path / "cluster")
    assert records(looped) == records(today)
    a, b = today.summary, looped.summary
    for key in set(a) - {"per_replica"}:
        assert b[key] == a[key], key
    assert set(b) - set(a) == CLUSTER_ONLY
    assert b["per_replica"] == a["per_replica"]


def test_a_one_engine_summary_has_one_replica():
    cfg = sim()
    result = run_job(cfg, "/tmp/servelab-test-one-replica")
    (only,) = result.summary["per_replica"]
    assert only["role"] == "mixed" and only["num_requests"] == result.summary["num_requests"]
    assert only["output_tokens"] == result.summary["output_tokens"]


# ---- N replicas ---------------------------------------------------------------------------

def test_replicas_place_each_request_once_and_run_deterministically(tmp_path):
    first = run_job(sim("cluster.replicas=3"), tmp_path / "a")
    again = run_job(sim("cluster.replicas=3"), tmp_path / "b")
    assert records(first) == records(again)
    s = first.summary
    assert s["num_finished"] == 60 and s["leaked_blocks"] == 0 and s["num_replicas"] == 3
    per = s["per_replica"]
    assert [p["num_requests"] for p in per] == [20, 20, 20]  # round_robin
    assert sum(p["output_tokens"] for p in per) == s["output_tokens"]
    assert len({r["id"] for r in first.requests}) == 60


def test_more_replicas_cut_queueing_at_a_rate_one_cannot_serve(tmp_path):
    hot = ["workload.rate=400", "workload.num_requests=200"]
    one = run_job(sim(*hot), tmp_path / "one").summary
    four = run_job(sim(*hot, "cluster.replicas=4", "router=least_outstanding"), tmp_path / "four").summary
    assert four["ttft_ms"]["p50"] < one["ttft_ms"]["p50"]
    assert four["num_gpus"] == 4


def test_real_model_replicas_give_one_engines_tokens(tmp_path):
    base = ["model=tiny", "workload=synthetic", "workload.num_requests=6", "workload.rate=50",
            "clock=virtual", "time_model=roofline", "hardware=h100"]
    one = run_job(compose(base, logger="none", progress=False), tmp_path / "one")
    two = run_job(compose([*base, "cluster.replicas=2"], logger="none", progress=False), tmp_path / "two")
    assert {k: r["output_token_ids"] for k, r in records(two).items()} == \
           {k: r["output_token_ids"] for k, r in records(one).items()}
    assert [p["num_requests"] for p in two.summary["per_replica"]] == [3, 3]


def test_a_router_answering_an_unknown_replica_stops_the_run_naming_both(tmp_path, monkeypatch):
    monkeypatch.setattr(RoundRobinRouter, "route", lambda self, request, views, now: 99)
    with pytest.raises(RouterError, match=r"router plugin 'round_robin' returned 99 for request '[^']+'"):
        run_job(sim("cluster.replicas=2"), tmp_path)
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"].startswith("failed: RouterError")


def test_a_router_answering_none_or_a_replica_that_cannot_hold_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(RoundRobinRouter, "route", lambda self, request, views, now: None)
    with pytest.raises(RouterError, match="returned None"):
        run_job(sim("cluster.replicas=2"), tmp_path / "none")
    monkeypatch.setattr(RoundRobinRouter, "route", lambda self, request, views, now: views[0].index)
    monkeypatch.setattr(Replica, "can_hold", lambda self, request, tokens=None: self.index != 0)
    with pytest.raises(RouterError, match=r"placed request '[^']+' on replica 0, which cannot hold it"):
        run_job(sim("cluster.replicas=2"), tmp_path / "full")


# ---- prefill/decode disaggregation ----------------------------------------------------------

def test_disaggregated_run_moves_every_prompts_kv_and_counts_it(tmp_path):
    cfg = sim("cluster.prefill_replicas=2", "cluster.decode_replicas=2", base=SIM_70B)
    result = run_job(cfg, tmp_path)
    s = result.summary
    assert s["num_finished"] == 60 and s["leaked_blocks"] == 0
    per_token = kv_bytes_per_token(cfg, model_shape(cfg))
    assert per_token == 2 * 80 * 8 * 128 * 2  # Llama-3-70B, bf16: K and V, 80 layers, 8 KV heads of 128
    assert s["num_kv_transfers"] == 60
    assert s["kv_transfer_bytes"] == pytest.approx(per_token * s["prompt_tokens"])
    roles = [p["role"] for p in s["per_replica"]]
    assert roles == ["prefill", "prefill", "decode", "decode"]
    assert sum(p["num_requests"] for p in s["per_replica"] if p["role"] == "prefill") == 60
    # the prefill replicas generate the first tokens, the decode replicas the rest
    assert sum(p["output_tokens"] for p in s["per_replica"]) == s["output_tokens"]
    assert all(p["output_tokens"] == p["num_requests"] for p in s["per_replica"] if p["role"] == "prefill")


def test_ttft_includes_the_transfer_and_a_slow_link_shows_in_it(tmp_path):
    pd = ["cluster.prefill_replicas=1", "cluster.decode_replicas=1", "cluster.kv_link=inter_node",
          "cluster.overlap_kv_transfer=false"]
    fast = run_job(sim(*pd, base=SIM_70B), tmp_path / "fast")
    slow = run_job(sim(*pd, "hardware.inter_node_link_gb_s=0.5", base=SIM_70B), tmp_path / "slow")
    per_token = 2 * 80 * 8 * 128 * 2
    for rid, rec in records(slow).items():
        one_lane = per_token * rec["prompt_len"] / (0.5e9 * 4)  # TP 4 on each side: four links at once
        assert rec["ttft_ms"] >= one_lane * 1e3
    assert slow.summary["ttft_ms"]["p50"] > fast.summary["ttft_ms"]["p50"] + 10
    assert slow.summary["kv_transfer_s"] > 50 * fast.summary["kv_transfer_s"]


def test_overlapped_transfers_hide_behind_the_prefill(tmp_path):
    pd = ["cluster.prefill_replicas=1", "cluster.decode_replicas=1", "cluster.kv_link=inter_node"]
    hidden = run_job(sim(*pd, base=SIM_70B), tmp_path / "on").summary
    exposed = run_job(sim(*pd, "cluster.overlap_kv_transfer=false", base=SIM_70B), tmp_path / "off").summary
    assert hidden["kv_transfer_s"] == pytest.approx(exposed["kv_transfer_s"])
    assert hidden["kv_transfer_exposed_s"] < exposed["kv_transfer_exposed_s"]


def test_a_full_decode_replica_pushes_back_and_preempts_yet_every_request_finishes(tmp_path):
    tight = ["cluster.prefill_replicas=1", "cluster.decode_replicas=1", "cluster.decode.num_kv_blocks=160",
             "workload.rate=200", "workload.num_requests=80"]
    result = run_job(sim(*tight, base=SIM_70B), tmp_path)
    s = result.summary
    assert s["num_finished"] == 80 and s["leaked_blocks"] == 0
    decode = s["per_replica"][1]
    assert decode["kv_utilization_max"] > 0.9
    assert decode["num_preemptions"] > 0  # preemption still works on the decode side
    assert s["kv_transfer_exposed_s"] > s["kv_transfer_s"]  # transfers waited for blocks


def test_link_choice_follows_the_nodes_replicas_sit_on():
    cfg = sim("cluster.prefill_replicas=2", "cluster.decode_replicas=2", base=SIM_70B)
    cluster, stacks = build_cluster(cfg)
    assert {r.index: r.gpu_offset for r in cluster.replicas} == {0: 0, 1: 4, 2: 8, 3: 12}
    assert {link.kind for link in cluster.links.values()} == {"inter_node"}
    assert cluster.links[(0, 2)].lanes == 4 and cluster.links[(0, 2)].bytes_per_s == 50e9
    wide = sim("cluster.prefill_replicas=2", "cluster.decode_replicas=2", "cluster.gpus_per_node=16", base=SIM_70B)
    cluster, _ = build_cluster(wide)
    assert {link.kind for link in cluster.links.values()} == {"intra_node"}
    assert cluster.links[(0, 2)].bytes_per_s == 450e9


def test_transfer_pricing():
    link = KVLink(bytes_per_s=50e9, latency_s=20e-6, lanes=4, kind="inter_node")
    assert link.seconds(0) == 0.0
    assert link.seconds(200e6) == pytest.approx(20e-6 + 200e6 / 200e9)
    # not overlapped: from the allocation, after the link is free
    assert schedule_transfer(link, 200e6, 5.0, 1.0, 2.0, 2.0, 80, False)[:2] == pytest.approx((5.0, 5.0 + link.seconds(200e6)))
    # overlapped: streamed from the prefill's start; at least the last layer's share after its end
    start, done, duration = schedule_transfer(link, 200e6, 0.0, 1.0, 2.0, 2.0, 80, True)
    assert start == 1.0 and done == pytest.approx(2.0 + duration / 80)
    # overlapped but the blocks came late (back-pressure): streamed only from the allocation
    assert schedule_transfer(link, 200e6, 0.0, 1.0, 2.0, 3.0, 80, True)[0] == 3.0
    h100 = HardwareProfile.from_config(sim().hardware)
    assert h100.kv_link(True) == pytest.approx((450e9, 10e-6)) and h100.kv_link(False) == pytest.approx((50e9, 20e-6))


# ---- bad input ------------------------------------------------------------------------------

@pytest.mark.parametrize("overrides, message", [
    (["cluster.prefill_replicas=2"], "cluster.prefill_replicas=2 needs cluster.decode_replicas=<n> as well"),
    (["cluster.decode_replicas=1"], "cluster.decode_replicas=1 needs cluster.prefill_replicas=<n> as well"),
    (["cluster.replicas=0"], "cluster.replicas=0 must be >= 1"),
    (["cluster.replicas=2", "cluster.prefill_replicas=1", "cluster.decode_replicas=1"], "set one or the other"),
    (["cluster.prefill_replicas=1", "cluster.decode_replicas=1", "cluster.decode.block_size=32"],
     r"prefill replicas \(.*block_size=16\) and the decode replicas \(.*block_size=32\)"),
    (["cluster.prefill_replicas=1", "cluster.decode_replicas=1", "cluster.decode.kv_cache_dtype=int8"],
     r"kv_cache_dtype=auto .* kv_cache_dtype=int8"),
    (["cluster.prefill_replicas=1", "cluster.decode_replicas=1", "cluster.decode.hardware=b300"],
     "cluster.decode.hardware=b300 is not a hardware option"),
    (["cluster.replicas=2", "tensor_parallel_size=16"], "a tensor-parallel group stays on one node"),
])
def test_bad_cluster_config_is_one_line(overrides, message):
    with pytest.raises(ConfigError, match=message) as info:
        build_cluster(sim(*overrides))
    assert "\n" not in str(info.value)


def test_the_in_process_cluster_needs_the_virtual_clock_and_real_disaggregation_the_wall_clock():
    real = ["model=tiny", "workload=synthetic"]
    with pytest.raises(ConfigError, match="on the wall clock a cluster is engine processes"):
        build_cluster(compose([*real, "cluster.replicas=2"], logger="none"))
    with pytest.raises(ConfigError, match="drop clock=virtual"):  # real KV moves between processes (test_cluster_procs)
        build_cluster(compose([*real, "clock=virtual", "time_model=roofline", "cluster.prefill_replicas=1",
                               "cluster.decode_replicas=1"], logger="none"))


def test_pools_take_their_own_tensor_parallelism_and_hardware():
    cfg = sim("cluster.prefill_replicas=1", "cluster.decode_replicas=2", "cluster.decode.tensor_parallel_size=2",
              "cluster.decode.hardware=h200", base=SIM_70B)
    cluster, _ = build_cluster(cfg)
    shapes = [(r.role, r.tensor_parallel_size, r.hardware) for r in cluster.replicas]
    assert shapes == [("prefill", 4, "h100"), ("decode", 2, "h200"), ("decode", 2, "h200")]
    assert cluster.links[(0, 1)].lanes == 2


def test_an_interrupted_cluster_writes_every_request_it_had(tmp_path, monkeypatch):
    calls = {"n": 0}
    real = RoundRobinRouter.route

    def route(self, request, views, now):
        calls["n"] += 1
        if calls["n"] == 40:
            raise KeyboardInterrupt
        return real(self, request, views, now)

    monkeypatch.setattr(RoundRobinRouter, "route", route)
    with pytest.raises(KeyboardInterrupt):
        run_job(sim("cluster.prefill_replicas=1", "cluster.decode_replicas=1", base=SIM_70B), tmp_path)
    summary = json.loads((tmp_path / "summary.json").read_text())
    lines = [json.loads(line) for line in (tmp_path / "requests.jsonl").read_text().splitlines()]
    assert summary["status"] == "interrupted" and summary["leaked_blocks"] is None
    ids = [r["id"] for r in lines]
    assert len(ids) == len(set(ids)) == summary["num_requests"] >= 15  # each request it had, once
    assert summary["num_finished"] + summary["num_unfinished"] == summary["num_requests"]


def test_serve_refuses_a_cluster():
    from servelab.serve.command import check_serve_config

    with pytest.raises(ConfigError, match="servelab serve runs one engine"):
        check_serve_config(compose(["model=tiny", "cluster.replicas=2"], logger="none"))


def test_compare_reads_cluster_runs(tmp_path):
    from servelab.cli.compare import main as compare_main

    run_job(sim("cluster.replicas=2"), tmp_path / "a")
    run_job(sim("cluster.replicas=2", "router=least_outstanding"), tmp_path / "b")
    assert compare_main([str(tmp_path / "a"), str(tmp_path / "b"), "--format", "csv"]) in (0, None)
