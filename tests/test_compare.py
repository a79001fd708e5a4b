"""servelab compare: a table of runs with the keys that distinguish them, CSV/Markdown, a plot;
W&B runs of one multirun share a group (issue 15)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import yaml

from servelab.cli import compare

from servelab.run import loggers
from servelab.cli.compare import CompareError, find_runs, load_run

from conftest import REPO


def _run(root, name, cfg, summary):
    d = root / name
    d.mkdir(parents=True)
    (d / "config.yaml").write_text(yaml.safe_dump(cfg))
    (d / "summary.json").write_text(json.dumps(summary))
    return d


@pytest.fixture
def sweep(tmp_path):
    base = {"seed": 0, "logger": {"name": "wandb"}, "hydra_like": 1}
    for i, (rate, sched) in enumerate([(1.0, "fcfs"), (2.0, "fcfs"), (1.0, "slo_aware"), (2.0, "slo_aware")]):
        _run(tmp_path / "sweep", f"{i}_rate={rate},scheduler={sched}",
             {**base, "workload": {"rate": rate}, "scheduler": {"name": sched}, "logger": {"name": "wandb", "x": i}},
             {"num_finished": 10, "ttft_ms": {"p99": 100.0 * rate + (i > 1)}, "slo_attainment": None})
    return tmp_path / "sweep"


def test_table_of_a_multirun_shows_only_what_differs(sweep, tmp_path, capsys):
    assert compare.main([str(sweep), "--metrics", "ttft_ms.p99,slo_attainment", "--out", str(tmp_path / "t.md")]) == 0
    md = (tmp_path / "t.md").read_text().splitlines()
    assert md[0] == "| run | scheduler.name | workload.rate | ttft_ms.p99 | slo_attainment |"  # no seed, no logger
    assert md[2] == "| 0_rate=1.0,scheduler=fcfs | fcfs | 1 | 100 | n/a |"
    out = capsys.readouterr().out
    assert "4 runs" in out and "slo_aware" in out
    compare.main([str(sweep), "--metrics", "ttft_ms.p99", "--out", str(tmp_path / "t.csv")])
    assert (tmp_path / "t.csv").read_text().splitlines()[1] == '"0_rate=1.0,scheduler=fcfs",fcfs,1.0,100.0'


def test_plot_against_a_swept_key(sweep, tmp_path):
    compare.main([str(sweep), "--plot", "ttft_ms.p99", "--x", "workload.rate", "--plot-out", str(tmp_path / "p.png")])
    assert (tmp_path / "p.png").stat().st_size > 1000
    with pytest.raises(CompareError, match="--plot needs --x: the runs differ in"):
        compare.main([str(sweep), "--plot", "ttft_ms.p99"])


def test_run_folders_given_one_by_one_and_errors(sweep, tmp_path):
    runs = find_runs([sweep / "0_rate=1.0,scheduler=fcfs", sweep / "3_rate=2.0,scheduler=slo_aware"])
    assert [load_run(r)["summary"]["ttft_ms.p99"] for r in runs] == [100.0, 201.0]
    with pytest.raises(CompareError, match="no such folder"):
        find_runs([tmp_path / "nope"])
    with pytest.raises(CompareError, match=r"\['bogus'\] in no run's summary.json"):
        compare.main([str(sweep), "--metrics", "bogus"])


def test_multirun_jobs_share_a_wandb_group(monkeypatch):
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    assert loggers.sweep_group() is None  # not under Hydra
    fake = SimpleNamespace(mode=RunMode.MULTIRUN, sweep=SimpleNamespace(dir="multirun/2026-11-30/12-00-00"))
    monkeypatch.setattr(HydraConfig, "get", staticmethod(lambda: fake))
    assert loggers.sweep_group() == "multirun/2026-11-30/12-00-00"
    fake.mode = RunMode.RUN
    assert loggers.sweep_group() is None


def test_cli_lists_compare():
    assert "compare" in (REPO / "framework" / "cli" / "main.py").read_text()
