"""Multiruns past one process: Hydra's joblib and submitit launchers (the `sweep` extra) and the
presets in conf/hydra/launcher/. Jobs are short backend=sim runs (a second or two each)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import yaml

from conftest import REPO
from test_cli import run_cli

pytest.importorskip("hydra_plugins.hydra_joblib_launcher", reason="the sweep extra: pip install 'servelab[sweep]'")

SIM = ["backend=sim", "model=llama3_8b", "hardware=h100", "logger=none", "progress=false",
       "workload.num_requests=12", "workload.prompt_len.max=64", "workload.output_len.max=16"]
# log lines start with the id of the process that wrote them: the launcher's (Hydra's own log, on
# the console) and each job's (<sweep dir>/<job>/servelab.log)
PID_LOG = ["hydra.hydra_logging.formatters.simple.format='%(process)d [HYDRA] %(message)s'",
           "hydra.job_logging.formatters.simple.format='%(process)d %(message)s'"]


def job_dirs(sweep_dir):
    return sorted(p.parent for p in sweep_dir.glob("*/summary.json"))


def test_joblib_grid_runs_every_job_in_worker_processes(tmp_path):
    proc = run_cli("-m", "hydra/launcher=parallel", "hydra.launcher.n_jobs=2", *SIM, *PID_LOG,
                   "scheduler=fcfs,slo_aware", "max_num_seqs=8,16", f"hydra.sweep.dir={tmp_path}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    launcher_pids = {int(line.split()[0]) for line in (proc.stdout + proc.stderr).splitlines()
                     if "[HYDRA] Joblib.Parallel(n_jobs=2" in line}
    assert len(launcher_pids) == 1, proc.stdout[-3000:]
    jobs = job_dirs(tmp_path)
    assert len(jobs) == 4, list(tmp_path.iterdir())
    grid = set()
    pids = set()
    for job in jobs:
        summary = json.loads((job / "summary.json").read_text())
        assert summary["status"] == "completed" and summary["num_finished"] == 12 and summary["leaked_blocks"] == 0
        cfg = yaml.safe_load((job / "config.yaml").read_text())
        grid.add((cfg["scheduler"]["name"], cfg["max_num_seqs"]))  # the plugin group composed in the worker
        pids |= {int(line.split()[0]) for line in (job / "servelab.log").read_text().splitlines() if line}
    assert grid == {("fcfs", 8), ("fcfs", 16), ("slo_aware", 8), ("slo_aware", 16)}
    assert pids and not pids & launcher_pids, (pids, launcher_pids)  # worker processes, not the launcher


def test_a_failing_job_fails_the_sweep_after_the_others_finish(tmp_path):
    # 70B weights do not fit one H100: that job fails with the bad-input message, TP 8 still runs
    proc = run_cli("-m", "hydra/launcher=parallel", "hydra.launcher.n_jobs=2",
                   *[o for o in SIM if not o.startswith("model=")], "model=llama3_70b", "tensor_parallel_size=1,8",
                   f"hydra.sweep.dir={tmp_path}")
    assert proc.returncode != 0
    assert "the weights do not fit" in proc.stderr
    jobs = job_dirs(tmp_path)
    assert [yaml.safe_load((j / "config.yaml").read_text())["tensor_parallel_size"] for j in jobs] == [8]


def test_a_pip_installed_plugin_is_selectable_in_joblib_workers(tmp_path):
    target = tmp_path / "site"
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                          "--target", str(target), str(REPO / "examples" / "servelab-spf")],
                         capture_output=True, text=True, timeout=300)
    assert pip.returncode == 0, pip.stderr
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(target), os.environ.get("PYTHONPATH")]))}
    proc = run_cli("-m", "hydra/launcher=parallel", "hydra.launcher.n_jobs=2", *SIM, "scheduler=spf",
                   "scheduler.longest_first=true,false", f"hydra.sweep.dir={tmp_path}/sweep", env_extra=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    jobs = job_dirs(tmp_path / "sweep")
    flags = {yaml.safe_load((j / "config.yaml").read_text())["scheduler"]["longest_first"] for j in jobs}
    assert flags == {True, False}


@pytest.mark.slow  # its twin: the joblib grid above, through the same launcher plumbing
def test_submitit_local_runs_the_grid(tmp_path):
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher", reason="the sweep extra: pip install 'servelab[sweep]'")
    proc = run_cli("-m", "hydra/launcher=submitit_local", "hydra.launcher.timeout_min=5", *SIM,
                   "max_num_seqs=8,16", f"hydra.sweep.dir={tmp_path}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    jobs = job_dirs(tmp_path)
    assert len(jobs) == 2
    assert all(json.loads((j / "summary.json").read_text())["status"] == "completed" for j in jobs)
    assert list(tmp_path.glob(".submitit/*/*_log.out"))  # submitit's own per-job logs


@pytest.mark.parametrize("preset,fields", [("slurm_cpu", {"cpus_per_task": 1, "timeout_min": 60}),
                                           ("slurm_gpu", {"gpus_per_node": 1, "timeout_min": 120})])
def test_slurm_presets_compose(preset, fields):
    # no Slurm here: check the preset resolves to the submitit Slurm launcher with its defaults
    pytest.importorskip("hydra_plugins.hydra_submitit_launcher", reason="the sweep extra: pip install 'servelab[sweep]'")
    proc = run_cli("--cfg", "hydra", f"hydra/launcher={preset}", "hydra.launcher.partition=p")
    assert proc.returncode == 0, proc.stderr[-3000:]
    launcher = yaml.safe_load(proc.stdout)["hydra"]["launcher"]
    assert launcher["_target_"].endswith("submitit_launcher.SlurmLauncher")
    assert launcher["partition"] == "p"
    for key, value in fields.items():
        assert launcher[key] == value
