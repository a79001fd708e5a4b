"""``servelab bench`` (issue 35 item 1): a load sweep of any stack, its curve, knee and plot."""

from __future__ import annotations

import csv
import json

import pytest

from servelab.cli import bench
from servelab.cli.compare_runs import find_runs, load_run
from servelab.core.errors import ConfigError

SIM = ["backend=sim", "model=llama3_8b", "hardware=h100", "workload=synthetic", "workload.num_requests=50",
       "logger=none", "progress=false"]


def _curve(folder) -> list[dict]:
    with (folder / "curve.csv").open() as fh:
        return list(csv.DictReader(fh))


def test_a_rate_bench_writes_the_curve_the_knee_and_runs_compare_reads(tmp_path, capsys):
    out = tmp_path / "b"
    code = bench.main([*SIM, "bench.rates=[2,8,32]", "slo.ttft_ms=100", "slo.tpot_ms=9", f"hydra.run.dir={out}"])
    assert code == 0
    rows = _curve(out)
    assert [r["load"] for r in rows] == ["2.0", "8.0", "32.0"] and {r["load_kind"] for r in rows} == {"rate"}
    assert all(r["status"] == "completed" for r in rows)
    throughput = [float(r["request_throughput_req_s"]) for r in rows]
    assert throughput == sorted(throughput) and throughput[0] < throughput[-1]
    for key in ("ttft_ms_p90", "tpot_ms_p99", "e2e_ms_p50", "output_throughput_tok_s", "slo_attainment"):
        assert all(r[key] for r in rows), key
    assert (out / "curve.png").stat().st_size > 0
    knee = json.loads((out / "knee.json").read_text())
    holds = [p["holds"] for p in knee["points"]]
    assert [r["slo_holds"] for r in rows] == [str(h) for h in holds]
    first_miss = holds.index(False) if False in holds else len(holds)
    assert knee["knee"] == (float(rows[first_miss - 1]["load"]) if first_miss else None)
    assert knee["message"] in capsys.readouterr().out
    runs = [load_run(p) for p in find_runs([out])]  # compare reads the points as rows
    assert [r["config"]["workload.rate"] for r in runs] == [2.0, 8.0, 32.0]
    assert all(r["status"] == "completed" for r in runs)


def test_a_concurrency_bench_runs_closed_loop_points(tmp_path, capsys):
    out = tmp_path / "c"
    assert bench.main([*SIM, "bench.concurrencies=[4,1]", f"hydra.run.dir={out}"]) == 0
    rows = _curve(out)
    assert [r["folder"] for r in rows] == ["0_concurrency=1", "1_concurrency=4"]  # increasing load
    summaries = [json.loads((out / r["folder"] / "summary.json").read_text()) for r in rows]
    assert [s["concurrency"] for s in summaries] == [1, 4]
    assert [s["max_concurrent_requests"] for s in summaries] == [1, 4]
    knee = json.loads((out / "knee.json").read_text())
    assert knee["knee"] is None and knee["message"].startswith("no SLO configured")
    assert "no SLO configured" in capsys.readouterr().out


def test_a_failed_point_is_marked_the_others_run_and_the_exit_code_is_1(tmp_path, monkeypatch, capsys):
    from servelab.run import session

    real = session.run_job

    def failing_at_4(cfg, folder, *args, **kwargs):
        if cfg.workload.concurrency == 4:
            raise RuntimeError("the engine fell over")
        return real(cfg, folder, *args, **kwargs)

    monkeypatch.setattr(session, "run_job", failing_at_4)
    out = tmp_path / "f"
    code = bench.main([*SIM, "workload.num_requests=12", "bench.concurrencies=[1,4,8]", "slo.ttft_ms=1000",
                       f"hydra.run.dir={out}"])
    assert code == 1
    rows = _curve(out)
    assert [r["status"] for r in rows] == ["completed", "failed: RuntimeError: the engine fell over", "completed"]
    assert (out / "1_concurrency=4" / "error.txt").read_text().startswith("failed: RuntimeError")
    assert json.loads((out / "knee.json").read_text())["knee"] == 1
    assert "1 of 3 points failed" in capsys.readouterr().err
    statuses = [load_run(p)["status"] for p in find_runs([out])]
    assert statuses[1].startswith("failed") and statuses[0] == statuses[2] == "completed"


@pytest.mark.parametrize("args, message", [
    ([], "servelab bench needs exactly one of bench.rates=[...]"),
    (["bench.rates=[1]", "bench.concurrencies=[1]"], "servelab bench needs exactly one of"),
    (["bench.concurrencies=[0,2]"], "bench.concurrencies: 0 is not a load (each >= 1)"),
    (["bench.rates=[1,1]"], "bench.rates=[1.0, 1.0]: a load point is given twice"),
    (["bench.rates=[1]", "bench.percentile=0"], "bench.percentile=0.0 must be in (0, 100]"),
    (["bench.rates=[1]", "workload=trace", "workload.path=azure_conv"], "bench.rates sets workload.arrival"),
])
def test_bad_bench_settings_are_one_line_before_any_point(tmp_path, args, message):
    out = tmp_path / "bad"
    with pytest.raises(ConfigError) as err:
        bench.main([*SIM[:3], "logger=none", *args, f"hydra.run.dir={out}"])
    assert str(err.value).startswith(message) and "\n" not in str(err.value)
    assert not out.exists()


def test_usage_lists_bench_and_its_keys():
    from servelab.cli.usage import usage_text

    text = usage_text()
    assert "  bench         a load sweep (rates or concurrencies) of any stack: curve.csv/png, the SLO knee" in text
    assert "rates: list[float] | None = null" in text and "concurrencies: list[int] | None = null" in text


@pytest.mark.slow
def test_the_readmes_load_curve_finds_the_knee_it_quotes(tmp_path, capsys):
    """The README's one-command load curve (Llama-3-70B TP 4 on simulated H100s, 200 ms TTFT) crosses its
    SLO inside the sweep, and prints the knee line the README and docs/bench.md quote (the virtual clock:
    the same figures on any machine). ~30 s on 2 cores; the knee's logic is tested fast above."""
    import re
    import shlex

    from conftest import REPO

    readme = (REPO / "README.md").read_text().replace("\n", " ")
    command = re.search(r"`(servelab bench [^`]+)`", readme).group(1)
    quoted = re.search(r"prints `(knee: [^`]+)`", readme).group(1)
    line = next(x for x in (REPO / "docs" / "bench.md").read_text().splitlines() if x.startswith(quoted))
    assert command in " ".join((REPO / "docs" / "bench.md").read_text().split())
    code = bench.main([*shlex.split(command)[2:], "logger=none", "progress=false", f"hydra.run.dir={tmp_path}"])
    knee = json.loads((tmp_path / "knee.json").read_text())
    assert code == 0 and not knee["past_the_sweep"] and knee["knee"] is not None
    assert knee["message"] == line and line in capsys.readouterr().out
