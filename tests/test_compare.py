"""servelab compare: a table of runs with the keys that distinguish them, CSV/Markdown, a plot;
W&B runs of one multirun share a group (issue 15)."""

from __future__ import annotations

import json
import subprocess
import sys
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
    assert md[0] == "| scheduler | workload.rate | ttft_ms.p99 | slo_attainment |"  # no seed, no logger, no folder
    assert md[2] == "| fcfs | 1 | 100 | n/a |"  # a metric asked for by name stays, n/a or not
    out = capsys.readouterr().out
    assert out.splitlines()[:3] == md[:3]  # not a terminal: the same Markdown on stdout
    compare.main([str(sweep), "--metrics", "ttft_ms.p99", "--out", str(tmp_path / "t.csv")])
    assert (tmp_path / "t.csv").read_text().splitlines()[1] == 'fcfs,1.0,100.0,"0_rate=1.0,scheduler=fcfs"'


CLI = "from servelab.cli.main import main; main()"  # `servelab` as the console script runs it


def _many_metrics(sweep):
    for i, d in enumerate(sorted(sweep.iterdir())):
        summary = json.loads((d / "summary.json").read_text())
        summary.update({"num_rejected": 0, "output_throughput_tok_s": 100.5 + i, "ttft_ms": {"p50": 5.0, "p99": 9.0 + i},
                        "tpot_ms": {"p50": 2.0}, "goodput_req_s": None, "num_preemptions": i,
                        "prefix_cache_hit_rate": 0.0, "leaked_blocks": 0})
        (d / "summary.json").write_text(json.dumps(summary))


def test_piped_output_is_markdown_labelled_by_the_differing_keys(sweep):
    """Piped (not a TTY): plain Markdown; many metrics: one row each, a column per run headed by the
    keys that tell the runs apart; default metrics n/a in every run are left out (and said so)."""
    _many_metrics(sweep)
    proc = subprocess.run([sys.executable, "-c", CLI, "compare", str(sweep)], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0] == ("| metric | scheduler=fcfs workload.rate=1 | scheduler=fcfs workload.rate=2 "
                        "| scheduler=slo_aware workload.rate=1 | scheduler=slo_aware workload.rate=2 |")
    assert "| ttft_ms.p99 | 9 | 10 | 11 | 12 |" in lines and "| num_preemptions | 0 | 1 | 2 | 3 |" in lines
    assert "| output_throughput_tok_s | 100.5 | 101.5 | 102.5 | 103.5 |" in lines
    assert not any(line.startswith(("| slo_attainment", "| goodput_req_s")) for line in lines)
    assert lines[-1] == "n/a in every run: slo_attainment, goodput_req_s"
    assert "rate=1.0,scheduler" not in proc.stdout and "\x1b[" not in proc.stdout  # no folder names, no colour
    csv_lines = subprocess.run([sys.executable, "-c", CLI, "compare", str(sweep), "--format", "csv"],
                               capture_output=True, text=True, timeout=60).stdout.splitlines()
    assert csv_lines[0].startswith("scheduler,workload.rate,num_finished,") and csv_lines[0].endswith(",folder")
    assert csv_lines[1].startswith("fcfs,1.0,10,0,100.5,") and "slo_attainment" not in csv_lines[0]


def test_table_format_and_layouts(sweep, capsys):
    _many_metrics(sweep)
    compare.main([str(sweep), "--format", "table"])
    out = capsys.readouterr().out
    assert "4 runs" in out and "n/a in every run: slo_attainment, goodput_req_s" in out
    assert "scheduler" in out and "slo_aware" in out and "rate=1.0,scheduler" not in out
    compare.main([str(sweep), "--format", "markdown", "--layout", "runs"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("| scheduler | workload.rate | num_finished |")
    assert lines[2].startswith("| fcfs | 1 | 10 | 0 | 100.5 |")


def test_labels_leave_out_what_a_group_option_decides_and_name_repeats_by_folder(tmp_path):
    for i, (model, hidden) in enumerate([("tiny", 256), ("tiny_code", 128), ("tiny", 256)]):
        _run(tmp_path / "s", f"{i}_model={model}", {"model": {"name": model, "hidden_size": hidden}, "seed": 0},
             {"num_finished": i})
    table = compare.compare_runs([load_run(r) for r in find_runs([tmp_path / "s"])], ["num_finished"])
    assert table.key_header == ["run", "model"]  # hidden_size follows from model; runs 0 and 2 are repeats
    assert table.labels() == ["0_model=tiny (model=tiny)", "1_model=tiny_code (model=tiny_code)",
                              "2_model=tiny (model=tiny)"]


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
