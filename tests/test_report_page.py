"""``servelab report`` / ``report=true`` (issue 48, item 1): the page of a simulated run, a simulated
cluster run and a KV-tier run, and of several runs overlaid; the per-step timeline every run keeps."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from conftest import compose
from servelab.engine.timeline import StepTimeline
from servelab.results.page import FIGURES_FOLDER, PAGE, write_page
from servelab.run.session import run_job

# a pool of 96 blocks: requests wait and are preempted, so every figure has something to show
SIM = ("backend=sim", "model=llama3_8b", "logger=none", "progress=false", "workload.num_requests=50",
       "workload.rate=20", "slo.ttft_ms=30", "slo.tpot_ms=20", "num_kv_blocks=96")
# 70B at TP 4 on a GPU pool below the chat's working set: the host tier gets hits (tests/test_kv_tiers.py)
TIERS = ("backend=sim", "model=llama3_70b", "tensor_parallel_size=4", "workload=chat_sessions",
         "workload.num_sessions=8", "workload.session_rate=2.0", "workload.think_time_s=4.0", "num_kv_blocks=600",
         "logger=none", "progress=false", "kv_tiers=host", "kv_tier_policy=write_back")
RUNS = {"sim": SIM, "cluster": (*SIM, "cluster.replicas=3", "router=round_robin"), "tiers": TIERS}
OVER_TIME = ["running_over_time.png", "waiting_over_time.png", "kv_used_over_time.png", "tokens_over_time.png",
             "preemptions_over_time.png"]
EXPECTED = {
    "sim": ["ttft_cdf.png", "tpot_cdf.png", "e2e_cdf.png", *OVER_TIME],
    "cluster": ["ttft_cdf.png", "tpot_cdf.png", "e2e_cdf.png", *OVER_TIME, "routing.png", "replicas_0.png"],
    "tiers": ["ttft_cdf.png", "tpot_cdf.png", "e2e_cdf.png", *OVER_TIME, "kv_tier_hits.png", "kv_tier_load.png"],
}


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("report-runs")
    for name, overrides in RUNS.items():
        run_job(compose(*overrides), root / name)
    return {name: root / name for name in RUNS}


def check_page(page: Path) -> list[str]:
    """Every PNG in the figures folder is shown by the page, and everything the page refers to exists;
    returns the figures' names."""
    html = page.read_text()
    refs = re.findall(r'(?:src|href)="([^"]+)"', html)
    assert refs, html[:500]
    for ref in refs:
        assert (page.parent / ref).is_file(), ref
    pngs = sorted(p.name for p in (page.parent / FIGURES_FOLDER).glob("*.png"))
    assert sorted(Path(r).name for r in refs) == pngs
    for png in pngs:
        assert (page.parent / FIGURES_FOLDER / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    return pngs


@pytest.mark.parametrize("name", list(RUNS))
def test_a_page_shows_every_figure_of_its_run(runs, name, tmp_path):
    page = write_page([runs[name]], tmp_path / "page")
    assert page == tmp_path / "page" / PAGE
    assert sorted(check_page(page)) == sorted(EXPECTED[name])


def test_several_runs_overlay_one_figure_per_metric_labelled_by_folder(runs, tmp_path):
    page = write_page([runs["sim"], runs["cluster"]], tmp_path)
    figures = check_page(page)
    assert "ttft_cdf.png" in figures and "replicas_1.png" in figures  # the cluster is the second run
    html = page.read_text()
    assert "<th>sim</th>" in html and "<th>cluster</th>" in html


def test_without_out_the_page_goes_into_the_run_folder_and_replaces_its_figures(runs):
    folder = runs["sim"]
    (folder / FIGURES_FOLDER).mkdir(exist_ok=True)
    (folder / FIGURES_FOLDER / "stale.png").write_bytes(b"old")
    page = write_page([folder])
    assert page == folder / PAGE
    check_page(page)


def test_report_true_writes_the_page_at_the_end_of_the_run(tmp_path):
    run_job(compose(*SIM[:3], "progress=false", "workload.num_requests=8", "report=true"), tmp_path)
    check_page(tmp_path / PAGE)


def test_the_timeline_has_a_row_per_step_and_is_the_same_with_fast_forward(tmp_path):
    """Each step is a row while the run is short; the fast-forward's spans record what the step-by-step path
    records (nothing waits in a span), so the two timelines are equal."""
    got = {}
    for ff in ("true", "false"):
        result = run_job(compose(*SIM, f"sim.fast_forward={ff}"), tmp_path / ff)
        with np.load(tmp_path / ff / "timeline.npz") as z:
            got[ff] = {k: z[k] for k in z.files}
        assert len(got[ff]["r0.time_s"]) == result.summary["num_steps"]
        assert got[ff]["r0.preemptions"][-1] == result.summary["num_preemptions"]
    assert got["true"].keys() == got["false"].keys()
    for k in got["true"]:
        np.testing.assert_array_equal(got["true"][k], got["false"][k], err_msg=k)
    assert got["true"]["r0.waiting"].max() > 0 and got["true"]["r0.preemptions"][-1] > 0  # a small pool


def test_the_timeline_thins_evenly_and_keeps_every_preemption():
    t = StepTimeline(max_rows=8)
    for step in range(1, 100):
        if step % 10 == 0:
            t.preempted(1)
        t.due -= 1
        if not t.due:
            t.add(float(step), 1.0, step, 0, step, 0, 0.5)
    assert len(t) < 8 and t.stride == 16
    assert list(t.time_s) == [16.0, 32.0, 48.0, 64.0, 80.0, 96.0]
    assert list(t.preemptions) == [1, 3, 4, 6, 8, 9] and t.num_preemptions == 9


def test_a_multirun_folder_stands_for_its_jobs_in_job_order(runs, tmp_path):
    import shutil

    for job, name in (("10_b", "cluster"), ("2_a", "sim")):
        shutil.copytree(runs[name], tmp_path / "sweep" / job)
    (tmp_path / "sweep" / "multirun.yaml").write_text("{}\n")
    page = write_page([tmp_path / "sweep"])
    assert page == tmp_path / "sweep" / PAGE
    check_page(page)
    html = page.read_text()
    assert html.index("<th>2_a</th>") < html.index("<th>10_b</th>")


def test_report_help_is_plain_text(capsys):
    from servelab.cli.report import main

    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert out.startswith("usage: servelab report") and "``" not in out


def test_runs_are_labelled_by_the_overrides_that_set_them_apart_else_by_their_folders(tmp_path):
    from servelab.results.page import run_labels

    def run(name: str, *overrides: str) -> Path:
        (tmp_path / name / ".hydra").mkdir(parents=True)
        (tmp_path / name / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
        return tmp_path / name

    a = run("0_backend=sim,scheduler=fcfs,slo.tpot_m-0123abcd", "backend=sim", "scheduler=fcfs")
    b = run("1_backend=sim,scheduler=slo_aware,slo.t-4567cdef", "backend=sim", "scheduler=slo_aware")
    base = run("base", "backend=sim")
    assert run_labels([a, b]) == ["scheduler=fcfs", "scheduler=slo_aware"]
    assert run_labels([base, a]) == ["base", "scheduler=fcfs"]  # nothing of its own: its folder
    assert run_labels([a]) == [a.name]
    (tmp_path / "x" / "run").mkdir(parents=True)
    (tmp_path / "y" / "run").mkdir(parents=True)
    assert run_labels([tmp_path / "x" / "run", tmp_path / "y" / "run"]) == ["x/run", "y/run"]  # no overrides


def test_a_run_without_a_timeline_gets_its_page_without_the_figures_over_time(runs, tmp_path):
    import shutil

    old = shutil.copytree(runs["sim"], tmp_path / "old", ignore=shutil.ignore_patterns("timeline.npz", "report*"))
    page = write_page([old])
    assert sorted(check_page(page)) == ["e2e_cdf.png", "tpot_cdf.png", "ttft_cdf.png"]
    assert "no timeline.npz" in page.read_text()
