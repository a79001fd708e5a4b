"""servelab.cluster.fragmentation: which queued requests the probe calls fragmented (fits in the sum of
free blocks, on no replica) or stranded (fits on another replica), and that attaching it changes no result."""

from __future__ import annotations

import importlib.util
from types import SimpleNamespace

import pytest
from conftest import REPO

from servelab.api import compose
from servelab.cluster.build import build_cluster
from servelab.cluster.fragmentation import FragmentationProbe
from servelab.core.request import Request, Status


def _replica(free: int, waiting: list[int], running: int = 0):
    """A replica view with ``free`` blocks, queued requests of those token counts (16-token blocks)."""
    seqs = {f"w{i}-{n}": SimpleNamespace(id=f"w{i}-{n}", status=Status.WAITING, num_tokens=n)
            for i, n in enumerate(waiting)}
    seqs.update({f"r{i}": SimpleNamespace(id=f"r{i}", status=Status.RUNNING, num_tokens=10_000) for i in range(running)})
    allocator = SimpleNamespace(num_free_blocks=lambda: free, block_table=lambda sid: [])
    return SimpleNamespace(engine=SimpleNamespace(allocator=allocator, limits=SimpleNamespace(block_size=16),
                                                  sequences=seqs))


def test_a_request_that_fits_only_in_the_sum_is_fragmented_and_one_that_fits_elsewhere_is_stranded():
    # needs: 159 tokens -> 10 blocks (fits at home), 320 -> 21 (fits on replica 1 only), 799 -> 50 (sum only),
    # 2000 -> 126 (fits nowhere, not even in the sum of 8 + 30 + 20 = 58)
    cluster = SimpleNamespace(replicas=[_replica(8, [100, 320, 799, 2000], running=3), _replica(30, []),
                                        _replica(20, [])])
    probe = FragmentationProbe(cluster)
    assert probe.count() == (1, 1, 4)


def test_the_probe_changes_no_result_and_stops_when_the_cluster_is_idle():
    cfg = compose(["backend=sim", "model=tiny", "cluster.replicas=2", "num_kv_blocks=24", "block_size=16",
                   "logger=none", "progress=false"])

    def run(probe: bool):
        cluster, stacks = build_cluster(cfg)
        requests = [Request(f"q{i}", tuple(range(1, 60 + 20 * i)), 120, arrival_time=0.001 * i) for i in range(8)]
        ended = []
        cluster.request_listeners.append(ended.append)
        p = FragmentationProbe(cluster, 0.01, until_s=0.35) if probe else None
        if p:
            p.attach()
        cluster.run(requests)
        for stack in stacks:
            stack.executor.shutdown()
        return sorted((s.id, tuple(s.output_token_ids), s.finish_time) for s in ended), p

    plain, _ = run(False)
    probed, p = run(True)
    assert probed == plain
    assert p.sums.samples > 0 and p.sums.queued_request_samples > 0


def test_run_cluster_jobs_probe_hook_sees_the_built_cluster_and_changes_no_result(tmp_path):
    from servelab.run.cluster_run import run_cluster_job

    overrides = ["backend=sim", "model=tiny", "cluster.replicas=2", "num_kv_blocks=24", "block_size=16",
                 "logger=none", "progress=false", "workload=synthetic", "workload.num_requests=12",
                 "workload.rate=50", "workload.prompt_len.mean=120", "workload.output_len.mean=60"]
    seen = []

    def attach(cluster, requests):
        probe = FragmentationProbe(cluster, 0.01, max(r.arrival_time for r in requests))
        probe.attach()
        seen.append((len(cluster.replicas), len(requests), probe))

    plain = run_cluster_job(compose(overrides), tmp_path / "plain").summary
    probed = run_cluster_job(compose(overrides), tmp_path / "probed", probe=attach).summary
    assert [(n, k) for n, k, _ in seen] == [(2, 12)] and seen[0][2].sums.samples > 0
    assert (tmp_path / "probed" / "requests.jsonl").read_bytes() == (tmp_path / "plain" / "requests.jsonl").read_bytes()
    for key in ("num_finished", "duration_s", "ttft_ms", "tpot_ms", "num_preemptions", "per_replica"):
        assert probed[key] == plain[key]
    wall = compose(["model=tiny_code", "cluster.replicas=2", "logger=none", "progress=false"])
    with pytest.raises(ValueError, match="simulator's cluster only"):  # refused before any process starts
        run_cluster_job(wall, tmp_path / "wall", [Request("a", (1, 2, 3), 2)], probe=attach)


def test_a_non_positive_interval_is_refused():
    with pytest.raises(ValueError, match="interval_s"):
        FragmentationProbe(SimpleNamespace(replicas=[]), 0.0)


def _study():
    spec = importlib.util.spec_from_file_location("migration_study", REPO / "experiments" / "migration" / "study.py")
    study = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(study)
    return study


@pytest.mark.slow
def test_the_study_runs_and_tabulates_every_arm():
    study = _study()
    res = study.study(60, (5.0,))
    assert [r["arm"] for r in res["rows"]] == [label for label, _ in study.ARMS]
    assert all(r["num_finished"] == 60 for r in res["rows"])
    assert study.table(res).count("\n") == 1 + len(study.ARMS)


def test_the_autoscaling_sections_trace_is_seeded_and_matching_picks_the_cheapest_run_under_each_target(tmp_path):
    study = _study()
    spec = {"duration_s": 60.0, "rates": (1.0, 4.0), "phase_s": 20.0, "gap_cv": 2.0}
    n = study.bursty_trace(tmp_path / "a.csv", seed=3, **spec)
    assert study.bursty_trace(tmp_path / "b.csv", seed=3, **spec) == n > 0
    assert (tmp_path / "a.csv").read_bytes() == (tmp_path / "b.csv").read_bytes()
    rows = [{"seed": 0, "setting": setting, "arm": arm, "ttft_p99_ms": p99, "ttft_mean_ms": 1.0, "tpot_p99_ms": 1.0,
             "gpu_hours": cost, "scale_ups": 1, "scale_downs": 1, "num_migrations": 0, "num_preemptions": 0}
            for setting, arm, p99, cost in (("threshold a", "dispatch-only", 900, 8.0), ("threshold b", "dispatch-only", 3000, 6.0),
                                            ("threshold a", "drain", 800, 7.0), ("threshold b", "drain", 1500, 5.0),
                                            ("threshold a", "llumnix eager", 5000, 4.0))]
    res = {"trace": {"seeds": [0]}, "rows": rows, "p99_targets_ms": [1000.0, 2000.0]}
    best = {(m["target_ms"], m["arm"]): m["best"] and m["best"]["setting"] for m in study.matched(res)}
    assert best == {(1000.0, "dispatch-only"): "threshold a", (1000.0, "drain"): "threshold a",
                    (1000.0, "llumnix eager"): None, (2000.0, "dispatch-only"): "threshold a",
                    (2000.0, "drain"): "threshold b", (2000.0, "llumnix eager"): None}
    table = study.autoscale_tables(res)
    assert "| 0 | 2 s | threshold | drain | threshold b | 1,500 | 5.00 | -37.5% |" in table
    assert "| 0 | 1 s | threshold | llumnix eager | none meets it |" in table


@pytest.mark.slow
def test_the_autoscaling_section_runs_every_arm_on_a_short_trace():
    study = _study()
    spec = {"duration_s": 40.0, "rates": (1.0, 3.0), "phase_s": 20.0, "gap_cv": 2.0}
    res = study.autoscale_study(spec, (0,), study.SCALERS[:1], (2,))
    assert [(r["setting"], r["arm"]) for r in res["rows"]] == [
        *((study.SCALERS[0][0], arm) for arm, _ in study.MIGRATION_ARMS),
        ("fixed 2 replicas", "dispatch-only"), ("fixed 2 replicas", "llumnix eager")]
    assert all(r["num_finished"] == res["trace"]["num_requests"][0] for r in res["rows"])
    assert "At matched P99" in study.autoscale_tables(res)
