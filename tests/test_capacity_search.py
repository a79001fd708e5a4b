"""experiments/capacity_search: the bisection on the rate, alone and over real sim runs (seconds)."""

from __future__ import annotations

import importlib.util
import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO


def load_search():
    spec = importlib.util.spec_from_file_location("capacity_search", REPO / "experiments" / "capacity_search" / "search.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


search = load_search()


def threshold(limit):
    return lambda rate: (rate <= limit, {})


@pytest.mark.parametrize("start", [0.3, 7.0, 7.3, 50.0])
def test_bisection_brackets_the_boundary_within_the_tolerance(start):
    res = search.bisect_max_rate(threshold(7.3), start, rel_tol=0.01)
    assert res.max_rate <= 7.3 < res.fail_rate
    assert (res.fail_rate - res.max_rate) / res.max_rate <= 0.01
    assert all(p.ok == (p.rate <= 7.3) for p in res.probes)
    assert res.probes[0].rate == start


def test_bisection_edges_and_probe_budget():
    never = search.bisect_max_rate(threshold(0.0), 4.0, min_rate=0.5)
    assert never.max_rate is None and never.fail_rate == 0.5
    always = search.bisect_max_rate(threshold(1e9), 4.0, max_rate=40.0)
    assert always.fail_rate is None and always.max_rate == 40.0
    capped = search.bisect_max_rate(threshold(7.3), 1.0, rel_tol=1e-9, max_probes=6)
    assert len(capped.probes) == 6 and capped.max_rate <= 7.3 < capped.fail_rate
    with pytest.raises(ValueError):
        search.bisect_max_rate(threshold(1.0), 0.0)


def test_search_over_sim_runs_finds_the_rate_where_p99_ttft_crosses_the_slo(tmp_path):
    # a 24-request Azure-format trace; the tiny model's shape priced on an L40S; 4 seats, so
    # compressing the arrivals queues requests and p99 TTFT crosses 20 ms somewhere
    rng = random.Random(0)
    lines, t = ["TIMESTAMP,ContextTokens,GeneratedTokens"], 0.0
    for _ in range(24):
        t += rng.expovariate(2.0)
        lines.append(f"2023-11-16 18:{int(t) // 60:02d}:{int(t) % 60:02d}.{int((t % 1) * 1e7):07d},"
                     f"{rng.randint(32, 256)},{rng.randint(4, 32)}")
    trace = tmp_path / "trace.csv"
    trace.write_text("\n".join(lines) + "\n")
    args = ["--trace", str(trace), "--num-requests", "24", "--model", "tiny", "--hardware", "l40s", "--tp", "1",
            "--schedulers", "fcfs", "--chunked", "on", "off", "--preemption", "recompute", "--max-num-seqs", "4",
            "--max-model-len", "2048", "--ttft-ms", "20", "--tpot-ms", "100", "--rel-tol", "0.05",
            "--out", str(tmp_path / "out")]
    results = search.main(args)
    assert json.loads((tmp_path / "out" / "results.json").read_text())["rows"] == json.loads(json.dumps(results["rows"]))
    assert (tmp_path / "out" / "results.csv").read_text().count("\n") == 3  # header + 2 stacks
    for row in results["rows"]:
        tm = row["at_max_rate"]["time_model"]
        assert row["at_max_rate"]["clock"] == "virtual" and tm["name"] == "auto"
        assert tm["chosen"] == "calibrated_roofline"  # no op tables for the tiny shape on an L40S
        lo, hi = row["max_rate_req_s"], row["fail_rate_req_s"]
        assert lo is not None and hi is not None and (hi - lo) / lo <= 0.05
        assert row["ttft_p99_ms"] <= 20 < max(p["ttft_p99_ms"] for p in row["probes"] if not p["ok"])
        for p in row["probes"]:  # each verdict is the SLO test on that run's own p99s
            assert p["ok"] == (p["complete"] and p["ttft_p99_ms"] <= 20 and p["tpot_p99_ms"] <= 100)
    # the sim is deterministic: the same search again gives the same rates
    again = search.main(args[:-1] + [str(tmp_path / "again")])
    assert [r["max_rate_req_s"] for r in again["rows"]] == [r["max_rate_req_s"] for r in results["rows"]]


def test_continuous_vs_static_sim_preset_is_70b_on_a100_in_the_sim(tmp_path):
    from servelab.api import compose
    from servelab.run.session import run_job

    tput = {}
    for scheduler in ("fcfs", "static"):
        cfg = compose(["experiment=continuous_vs_static_sim", f"scheduler={scheduler}", "max_num_seqs=16",
                       "workload.num_requests=96", "debug.log_steps=false"])
        assert (cfg.backend.name, cfg.model.name, cfg.hardware.name, cfg.tensor_parallel_size) == \
            ("sim", "llama2_70b", "a100_80gb", 4)
        s = run_job(cfg, tmp_path / scheduler).summary
        assert s["clock"] == "virtual" and s["time_model"]["name"] == "auto" and s["num_finished"] == 96
        tput[scheduler] = s["output_throughput_tok_s"]
    # flat decode steps at 70B: static batching's empty seats cost throughput almost one for one
    assert tput["fcfs"] > 2.5 * tput["static"], tput


def test_by_default_a_search_reads_the_packaged_trace_and_writes_a_fresh_folder():
    args = search.parse_args([])
    assert args.trace == "azure_conv"
    out = Path(args.out)
    assert out.parent == REPO / "multirun" / "capacity_search" and not out.exists()
    assert out != REPO / "experiments" / "capacity_search"  # never over the committed results


def test_a_missing_trace_is_one_line(tmp_path):
    proc = subprocess.run([sys.executable, str(REPO / "experiments" / "capacity_search" / "search.py"),
                           "--trace", str(tmp_path / "nope.csv"), "--out", str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1 and not (tmp_path / "out").exists()
    assert proc.stderr.strip() == (f"search.py: error: --trace='{tmp_path}/nope.csv': no such file, and not a "
                                   "packaged trace (names: azure_code, azure_conv, mooncake_conv, sharegpt_lengths)")
