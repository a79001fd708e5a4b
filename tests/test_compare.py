"""servelab compare: a table of runs with the keys that distinguish them, CSV/Markdown, a plot;
W&B runs of one multirun share a group (issue 15)."""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
from types import SimpleNamespace

import pytest
import yaml

from servelab.cli import compare

from servelab.results import loggers
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
    # the folder as given, not its leaf name alone; a status column always
    assert (tmp_path / "t.csv").read_text().splitlines()[:2] == [
        "scheduler,workload.rate,ttft_ms.p99,status,folder", f'fcfs,1.0,100.0,completed,"{sweep}/0_rate=1.0,scheduler=fcfs"']


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


# ---- issue 36: every job of a sweep, whatever became of it ----------------------------------------------

def _job(root, name, cfg=None, summary=None, hydra=None, error=None):
    """A hand-written job folder: what a run writes (``config.yaml``; ``summary``: a dict, or text for a
    half-written file), what Hydra writes before the job starts (``.hydra/config.yaml``) and what a job that
    failed before its results leaves (``error.txt``)."""
    d = root / name
    (d / ".hydra").mkdir(parents=True)
    (d / ".hydra" / "config.yaml").write_text(yaml.safe_dump(hydra or cfg or {}))
    if cfg is not None:
        (d / "config.yaml").write_text(yaml.safe_dump(cfg))
    if summary is not None:
        (d / "summary.json").write_text(summary if isinstance(summary, str) else json.dumps(summary))
    if error is not None:
        (d / "error.txt").write_text(error + "\n")
    return d


def _cfg(bs):
    return {"seed": 0, "block_size": bs, "scheduler": {"name": "fcfs", "seed": 0}}


# (folder, what it holds, the status compare gives it)
JOBS = [
    ("0_block_size=8", {"cfg": _cfg(8), "summary": {"num_finished": 10, "ttft_ms": {"p99": 12345.0},
                                                   "status": "completed"}}, "completed"),
    ("1_block_size=16", {"cfg": _cfg(16), "summary": {"num_finished": 4, "ttft_ms": {"p99": 7.5},
                                                     "status": "interrupted"}}, "interrupted"),
    ("2_block_size=24", {"hydra": {**_cfg(24), "scheduler": {"name": "fcfs", "seed": "${seed}"}},
                         "error": "ConfigError: block_size=24 must be a power of two"},
     "failed: ConfigError: block_size=24 must be a power of two"),
    ("3_block_size=32", {"hydra": _cfg(32)}, "no summary.json"),  # killed, or still running
    ("4_block_size=64", {"cfg": _cfg(64), "summary": '{"num_finished": 3, "ttf'},
     "failed: summary.json is not valid JSON"),  # half-written
    ("5_block_size=128", {"cfg": _cfg(128), "summary": {"num_finished": 0, "status": "failed: RuntimeError: boom"}},
     "failed: RuntimeError: boom"),
    ("6_block_size=256", {"cfg": _cfg(256), "summary": {"num_finished": 9}}, "completed"),  # older: no status
]


@pytest.fixture
def mixed(tmp_path):
    for name, holds, _ in JOBS:
        _job(tmp_path / "mixed", name, **holds)
    (tmp_path / "mixed" / "multirun.yaml").write_text("hydra: {}\n")
    (tmp_path / "mixed" / "analysis").mkdir()  # not a job folder
    return tmp_path / "mixed"


def test_every_job_folder_is_a_run_with_its_status(mixed):
    runs = [load_run(r) for r in find_runs([mixed])]
    assert [(r["path"].name, r["status"]) for r in runs] == [(name, status) for name, _, status in JOBS]
    assert runs[2]["config"]["block_size"] == 24  # from .hydra/config.yaml, interpolations resolved
    assert runs[2]["config"]["scheduler.seed"] == 0 and runs[2]["summary"] == {}


def test_runs_that_did_not_complete_are_rows_marked_and_counted(mixed, capsys, monkeypatch):
    assert compare.main([str(mixed), "--metrics", "num_finished,ttft_ms.p99", "--format", "markdown"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "| block_size | num_finished | ttft_ms.p99 | status |"
    assert lines[2:9] == [
        "| 8 | 10 | 12,345 | completed |",
        "| 16 | 4 | 7.5 | interrupted |",
        "| 24 | n/a | n/a | failed: ConfigError: block_size=24 must be a power of two |",
        "| 32 | n/a | n/a | no summary.json |",
        f"| 64 | n/a | n/a | {JOBS[4][2]} |",
        "| 128 | 0 | n/a | failed: RuntimeError: boom |",
        "| 256 | 9 | n/a | completed |"]
    assert lines[-1] == (
        "7 runs: 2 completed, 1 interrupted, 3 failed, 1 without summary.json (1_block_size=16: interrupted; "
        "2_block_size=24: failed: ConfigError: block_size=24 must be a power of two; 3_block_size=32: no summary.json; "
        f"4_block_size=64: {JOBS[4][2]}; 5_block_size=128: failed: RuntimeError: boom)")
    compare.main([str(mixed), "--metrics", "num_finished", "--format", "markdown", "--layout", "metrics"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == ("| metric | block_size=8 | block_size=16 [interrupted] | block_size=24 [failed] "
                        "| block_size=32 [no summary.json] | block_size=64 [failed] | block_size=128 [failed] "
                        "| block_size=256 |")
    assert lines[3].startswith("| status | completed | interrupted | failed: ConfigError")
    monkeypatch.setenv("COLUMNS", "300")  # a wide terminal: cells unfolded
    for layout in ("metrics", "runs"):  # on the terminal the status's first word; the footer says why
        compare.main([str(mixed), "--metrics", "num_finished", "--format", "table", "--layout", layout])
        out = capsys.readouterr().out
        assert "interrupted" in out and "no summary.json" in out and "ConfigError" not in out.split("\n7 runs:")[0]
        assert "\n7 runs: 2 completed, 1 interrupted, 3 failed" in out and "RuntimeError: boom" in out


def test_csv_has_a_status_column_and_the_footer_goes_to_stderr(mixed, sweep):
    proc = subprocess.run([sys.executable, "-c", CLI, "compare", str(mixed), "--format", "csv"],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    rows = list(csv.DictReader(io.StringIO(proc.stdout)))
    assert [(r["block_size"], r["status"]) for r in rows] == [(str(_cfg(bs)["block_size"]), status) for bs, (*_, status)
                                                              in zip((8, 16, 24, 32, 64, 128, 256), JOBS)]
    assert rows[0]["folder"] == str(mixed / "0_block_size=8") and rows[0]["ttft_ms.p99"] == "12345.0"
    assert proc.stderr.startswith("7 runs: 2 completed, 1 interrupted, 3 failed")
    proc = subprocess.run([sys.executable, "-c", CLI, "compare", str(sweep), "--format", "csv"],
                          capture_output=True, text=True, timeout=60)
    assert proc.stdout.splitlines()[0].endswith(",status,folder") and proc.stderr == ""  # all completed: no footer


def test_completed_only_exits_1_naming_the_others(mixed, sweep, capsys):
    assert compare.main([str(mixed), "--metrics", "num_finished", "--format", "markdown", "--completed-only"]) == 1
    out, err = capsys.readouterr()
    assert out.splitlines()[2:] == ["| 8 | 10 |", "| 256 | 9 |"]  # only the completed runs; no status column
    assert err.splitlines() == [
        "servelab compare: --completed-only: 5 of 7 runs did not complete, left out: 1_block_size=16 (interrupted); "
        "2_block_size=24 (failed: ConfigError: block_size=24 must be a power of two); 3_block_size=32 "
        f"(no summary.json); 4_block_size=64 ({JOBS[4][2]}); 5_block_size=128 (failed: RuntimeError: boom)"]
    assert compare.main([str(sweep), "--completed-only"]) == 0
    assert compare.main([str(mixed)]) == 0  # without the flag: everything shown, exit 0


def test_labels_are_unique_across_sweeps(tmp_path, capsys):
    for sweep in ("sweepA", "sweepB"):
        for i, bs in enumerate((24, 16)):
            _run(tmp_path / sweep, f"{i}_block_size={bs}", {"block_size": bs}, {"num_finished": i})
    _run(tmp_path / "sweepB", "2_block_size=8", {"block_size": 8}, {"num_finished": 2})
    runs = [load_run(r) for r in find_runs([tmp_path / "sweepA", tmp_path / "sweepB"])]
    table = compare.compare_runs(runs, ["num_finished"])
    assert table.labels() == ["sweepA/0_block_size=24 (block_size=24)", "sweepA/1_block_size=16 (block_size=16)",
                              "sweepB/0_block_size=24 (block_size=24)", "sweepB/1_block_size=16 (block_size=16)",
                              "2_block_size=8 (block_size=8)"]  # a unique folder name needs no prefix
    assert table.runs_as_rows(folder=True)[1][0][-1] == str(tmp_path / "sweepA" / "0_block_size=24")
    _run(tmp_path / "x" / "sweepA", "0_block_size=24", {"block_size": 24}, {"num_finished": 0})
    paths = [tmp_path / "sweepA" / "0_block_size=24", tmp_path / "x" / "sweepA" / "0_block_size=24"]
    assert compare.run_names(paths) == [f"{tmp_path.name}/sweepA/0_block_size=24", "x/sweepA/0_block_size=24"]


@pytest.mark.parametrize("value, cell", [
    (12345, "12,345"), (12345.0, "12,345"), (-12345, "-12,345"), (1234567, "1,234,567"),
    (9999, "9999"), (9999.4, "9999"), (9999.6, "10,000"), (0.12345, "0.1235"), (100.5, "100.5"),
    (True, "true"), (None, "n/a"), ("fcfs", "fcfs"),
])
def test_thousands_separators_for_ints_and_floats_alike(value, cell):
    assert compare._fmt(value) == cell


def test_csv_keeps_raw_numbers(tmp_path):
    _run(tmp_path / "s", "0_a", {"a": 1}, {"num_preemptions": 12345, "tokens": 123456.5})
    _run(tmp_path / "s", "1_a", {"a": 2}, {"num_preemptions": 7, "tokens": 1.5})
    compare.main([str(tmp_path / "s"), "--metrics", "num_preemptions,tokens", "--format", "csv",
                  "--out", str(tmp_path / "t.csv")])
    assert (tmp_path / "t.csv").read_text().splitlines()[1].startswith("1,12345,123456.5,completed,")


def test_plot_marks_runs_that_did_not_complete(mixed, tmp_path):
    runs = [load_run(r) for r in find_runs([mixed])]
    points = compare.plot_points(runs, "num_finished", "block_size")
    assert points == {"num_finished": [(8, 10, ""), (16, 4, "interrupted"), (128, 0, "failed"), (256, 9, "")]}
    compare.plot(runs, "num_finished", "block_size", tmp_path / "p.png")
    assert (tmp_path / "p.png").stat().st_size > 1000


def test_a_real_sweep_with_a_job_failing_at_startup(tmp_path):
    """The issue's sweep: block_size=24 fails at start-up (not a power of two), 16 runs."""
    proc = subprocess.run([sys.executable, str(REPO / "run.py"), "-m", "logger=none", "backend=sim", "model=llama3_8b",
                           "workload.num_requests=5", "progress=false", "block_size=24,16",
                           f"hydra.sweep.dir={tmp_path / 'X'}"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300)
    assert "block_size=24" in proc.stderr
    out = subprocess.run([sys.executable, "-c", CLI, "compare", str(tmp_path / "X"), "--metrics", "num_finished"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "| block_size | num_finished | status |"
    assert lines[2].startswith("| 24 | n/a | failed: ") or lines[2] == "| 24 | n/a | no summary.json |"
    assert lines[3] == "| 16 | 5 | completed |"
    assert lines[-1].startswith("2 runs: 1 completed, ")
