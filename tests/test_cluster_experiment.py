"""experiments/cluster_serving: the --quick run of every section, into a temporary folder (the
committed README and results stay untouched), and its results files' sanity."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "experiments" / "cluster_serving" / "run.py"
ROUTERS = {"round_robin", "least_outstanding", "least_outstanding (tokens)", "power_of_two", "prefix_affinity", "session"}


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and math.isfinite(v)


# the experiment script end to end (about a minute): its parts have fast twins in test_cluster.py and
# test_capacity_search.py
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def quick_results(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("cluster_serving")
    readme = (REPO / "experiments" / "cluster_serving" / "README.md")
    before = readme.read_text() if readme.is_file() else None
    proc = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--out", str(out)], cwd=REPO,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert (readme.read_text() if readme.is_file() else None) == before, "--quick touched the committed README"
    res = {name: json.loads((out / name / "results.json").read_text()) for name in ("routers", "disagg", "capacity")}
    for name in res:
        assert (out / name / "results.csv").is_file()
        assert (out / name / "section.md").read_text().strip()
        assert list((out / name).glob("*.png")), f"{name}: no plot"
    return res


def test_routers_section(quick_results):
    res = quick_results["routers"]
    assert set(res["workloads"]) == {"azure_conv", "azure_conv_hot", "azure_code", "mooncake", "chat"}
    for wname, d in res["workloads"].items():
        assert {r["router"] for r in d["rows"]} == ROUTERS, wname
        for r in d["rows"]:
            assert r["num_requests"] > 0
            for k in ("output_tok_s", "ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms", "tpot_p99_ms", "goodput_loose"):
                assert _finite(r[k]) and r[k] > 0, (wname, r["router"], k, r[k])
            assert r["ttft_p99_ms"] >= r["ttft_p50_ms"]
            assert r["load_imbalance"] >= 1.0
            assert 0.0 <= r["hit_rate"] <= 1.0
            assert r["num_kv_transfers"] == 0 and r["kv_transfer_bytes"] == 0
        if not d["prefix_caching"]:  # random prompt tokens: nothing to hit
            assert all(r["hit_rate"] == 0 for r in d["rows"])
    assert any(r["hit_rate"] > 0 for r in res["workloads"]["chat"]["rows"])


def test_disagg_section(quick_results):
    res = quick_results["disagg"]
    rows = [r for d in res["sweep"].values() for r in d["rows"]] + [r for d in res["pd"].values() for r in d["rows"]]
    rows += [r for d in res["links"].values() for r in d["rows"]]
    assert rows
    for r in rows:
        for k in ("goodput_per_gpu_loose", "goodput_per_gpu_tight_tpot", "goodput_per_gpu_tight_ttft"):
            assert _finite(r[k]) and r[k] >= 0, (r.get("config"), k, r[k])
        if r.get("config", "disaggregated").startswith("disaggregated"):
            assert r["kv_transfer_bytes"] > 0 and r["num_kv_transfers"] > 0
            assert r["kv_exposed_ms_mean"] >= 0
        else:
            assert r["kv_transfer_bytes"] == 0
    for d in res["sweep"].values():
        assert {r["config"] for r in d["rows"]} == {"colocated 2 x TP4", "disaggregated 1P + 1D"}
        assert {r["num_gpus"] for r in d["rows"]} == {8}
    # one request alone: the transfer costs what the link formula says, and never makes TTFT shorter
    alone = res["alone"]
    for r in alone["rows"]:
        assert r["ttft_ms"] >= alone["colocated_ttft_ms"] - 1e-6
        assert r["link_ms"] == pytest.approx(r["formula_ms"], rel=0.02, abs=0.05)
        if not r["overlap"]:
            assert r["ttft_ms"] - alone["colocated_ttft_ms"] == pytest.approx(r["exposed_ms"], rel=0.02, abs=0.05)
    # a slower link never shortens the exposed transfer
    for d in res["links"].values():
        for overlap in (True, False):
            pts = sorted((r for r in d["rows"] if r["overlap"] == overlap), key=lambda r: -r["link_gb_s"])
            assert [p["kv_exposed_ms_mean"] for p in pts] == sorted(p["kv_exposed_ms_mean"] for p in pts)


def test_capacity_section(quick_results):
    res = quick_results["capacity"]
    assert [f["rate"] for f in res["found"]] == res["settings"]["rates"]
    for f in res["found"]:
        for key in ("colocated_tp4", "colocated_tp8", "disaggregated_tp4"):
            row = f[key]
            assert row is not None and row["ok"], (f["rate"], key)
            assert row["attainment"] >= res["settings"]["target_attainment"]
            assert row["gpus"] == row["tp"] * row["replicas"]
    for row in res["tried"]:
        assert 0.0 <= row["attainment"] <= 1.0 and _finite(row["goodput_req_s"])
