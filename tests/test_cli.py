"""The command line as a user runs it: run.py in a subprocess, result files, errors, plugins."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time

import pytest

from conftest import REPO, pin_test_defaults

SMALL = ["workload.num_requests=6", "workload.prompt_len.max=48", "workload.output_len.max=12",
         "model.hidden_size=64", "model.num_hidden_layers=2", "model.intermediate_size=128", "progress=false"]


def run_cli(*args, env_extra=None, timeout=300, pin=True):
    """Run ``run.py`` from a scratch folder, so runs without hydra.run.dir leave nothing in the repo.
    ``pin``: the random-weight model and the synthetic workload unless ``args`` choose others."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", **(env_extra or {})}
    args = pin_test_defaults(args) if pin else list(args)
    return subprocess.run([sys.executable, str(REPO / "run.py"), *args], cwd=tempfile.mkdtemp(prefix="servelab-cli-"),
                          env=env, capture_output=True, text=True, timeout=timeout)


def test_run_writes_results_and_an_offline_wandb_run(tmp_path):
    proc = run_cli(*SMALL, f"hydra.run.dir={tmp_path}", "scheduler=fcfs", "allocator=paged", "block_size=16",
                   "debug.log_steps=true")
    assert proc.returncode == 0, proc.stderr
    lines = [json.loads(x) for x in (tmp_path / "requests.jsonl").read_text().splitlines()]
    assert len(lines) == 6
    for key in ("id", "prompt_len", "output_token_ids", "arrival_s", "ttft_ms", "tpot_ms", "e2e_ms", "queue_ms",
                "num_preemptions", "finish_reason"):
        assert key in lines[0]
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["num_finished"] == 6 and summary["leaked_blocks"] == 0
    for key in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"):
        assert set(summary[key]) == {"mean", "p50", "p90", "p99"}
    assert (tmp_path / "steps.jsonl").is_file() and (tmp_path / "config.yaml").is_file()
    assert list((tmp_path / "wandb").glob("offline-run-*/run-*.wandb")), "no offline W&B run"
    assert "output_throughput_tok_s" in proc.stdout  # the rich summary table


def test_cfg_job_prints_the_composed_config():
    proc = run_cli("--cfg", "job", "block_size=32")
    assert proc.returncode == 0, proc.stderr
    assert "block_size: 32" in proc.stdout and "scheduler:" in proc.stdout and "name: fcfs" in proc.stdout


def test_unknown_plugin_and_bad_type_fail_in_one_line():
    proc = run_cli("scheduler=nope")
    assert proc.returncode == 2 and proc.stderr.startswith("servelab: error: unknown scheduler option 'nope'")
    assert "fcfs" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    proc = run_cli("block_size=abc")
    assert proc.returncode != 0 and "block_size" in proc.stderr


def test_bad_value_names_the_key():
    proc = run_cli("block_size=12", "logger=none")
    assert proc.returncode != 0 and "block_size=12 must be a power of two" in proc.stderr


def test_multirun_runs_each_job_with_its_own_wandb_run(tmp_path):
    proc = run_cli("-m", *SMALL, "workload.num_requests=2", "block_size=8,32", f"hydra.sweep.dir={tmp_path}")
    assert proc.returncode == 0, proc.stderr
    summaries = sorted(tmp_path.glob("*/summary.json"))
    assert len(summaries) == 2
    assert {json.loads(p.read_text())["block_size"] for p in summaries} == {8, 32}
    for job in tmp_path.glob("*_block_size=*"):
        runs = list(job.glob("wandb/offline-run-*"))
        assert len(runs) == 1, job  # one W&B run per job, not the first one reused


def test_malformed_workload_line_names_file_and_line(tmp_path):
    path = tmp_path / "w.jsonl"
    path.write_text('{"prompt_len": 4, "max_tokens": 2}\n{"prompt_len": 4\n')
    proc = run_cli(*SMALL[3:], "logger=none", "workload=jsonl", f"workload.path={path}", f"hydra.run.dir={tmp_path}/o")
    assert proc.returncode != 0 and f"{path}:2: not valid JSON" in proc.stderr


def test_missing_checkpoint_weights_are_named(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], "model_type": "llama",
                                                      "hidden_size": 32, "intermediate_size": 64,
                                                      "num_hidden_layers": 1, "num_attention_heads": 2,
                                                      "vocab_size": 64}))
    proc = run_cli("logger=none", "model=hf", f"model.path={tmp_path}", f"hydra.run.dir={tmp_path}/o")
    assert proc.returncode != 0 and "no *.safetensors weight files" in proc.stderr


def test_ctrl_c_writes_partial_results_and_finishes_wandb(tmp_path):
    args = [sys.executable, str(REPO / "run.py"), *pin_test_defaults(SMALL), "workload.num_requests=400", "workload.rate=20",
            f"hydra.run.dir={tmp_path}"]
    out, err = tmp_path.parent / f"{tmp_path.name}.out", tmp_path.parent / f"{tmp_path.name}.err"
    # SIG_DFL in the child: a shell's background job (nohup ... &) inherits SIGINT ignored
    with out.open("w") as stdout_file, err.open("w") as stderr_file:
        proc = subprocess.Popen(args, cwd=tmp_path, env={**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"},
                                stdout=stdout_file, stderr=stderr_file, text=True,
                                preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
        # interrupt once the run has provably started stepping: W&B is up (the banner names it, printed after
        # the logger started) and a request has ended (its record is in requests.jsonl) - no sleep decides it
        records = tmp_path / "requests.jsonl"
        deadline = time.time() + 240
        while time.time() < deadline and proc.poll() is None and not (
                "W&B  " in out.read_text() and records.is_file() and records.stat().st_size > 0):
            time.sleep(0.1)
        assert proc.poll() is None, err.read_text()
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=120)
    stdout, stderr = out.read_text(), err.read_text()
    assert proc.returncode == 130, stderr
    assert stderr.strip().splitlines()[-1] == f"interrupted; partial results written to {tmp_path}", stderr
    assert "Traceback" not in stderr and "Traceback" not in stdout
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"] == "interrupted"
    assert 0 < summary["num_requests"] < 400 or summary["num_unfinished"] > 0
    run_dirs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert run_dirs and list(run_dirs[0].glob("run-*.wandb"))


def test_banner_then_a_run_whose_every_request_is_rejected_exits_2(tmp_path):
    proc = run_cli(*SMALL, "logger=none", "max_model_len=8", "num_kv_blocks=3", f"hydra.run.dir={tmp_path}")
    assert proc.returncode == 2, proc.stderr
    assert ("servelab: error: every request (6) was rejected, e.g. request 'req-0': prompt of" in proc.stderr
            and "max_model_len=8" in proc.stderr)
    for label in ("model", "device", "KV pool", "stack", "results", "W&B"):
        assert f"{label}  " in proc.stdout, label
    assert "3 blocks x 16 = 48 tokens" in proc.stdout and f"results  {tmp_path}\n" in proc.stdout
    assert "rejected requests: 6" in proc.stdout
    assert json.loads((tmp_path / "summary.json").read_text())["status"] == "failed: every request was rejected"


@pytest.mark.slow  # its twin: test_sweep_launchers' pip-installed plugin selected in joblib workers
def test_external_plugin_package_is_selectable_by_name(tmp_path):
    target = tmp_path / "site"
    pip = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                          "--target", str(target), str(REPO / "examples" / "servelab-spf")],
                         capture_output=True, text=True, timeout=300)
    assert pip.returncode == 0, pip.stderr
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(target), os.environ.get("PYTHONPATH")]))}
    proc = run_cli(*SMALL, "logger=none", "scheduler=spf", "scheduler.longest_first=true",
                   f"hydra.run.dir={tmp_path}/out", env_extra=env)
    assert proc.returncode == 0, proc.stderr
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["num_finished"] == 6
    assert "longest_first: true" in (tmp_path / "out" / "config.yaml").read_text()
    bad = run_cli("scheduler=spf", "scheduler.longest_first=sometimes", env_extra=env)
    assert bad.returncode != 0 and "longest_first" in bad.stderr


def test_help_is_servelabs_own_usage():
    proc = run_cli("--help", pin=False)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert out.startswith("usage: servelab") and "Hydra" not in out.splitlines()[0]
    for expected in ("scheduler  (default: fcfs)", "slo_aware: margin: float = 0.9",
                     "paged: prefix_caching: bool = false", "adaptive: victim: last|",
                     "jsonl: path: str = ???", "num_swap_blocks: int | None = null",
                     "strict_requests: bool = false", "slo: SLOConfig = {ttft_ms: float | None = null"):
        assert expected in out, expected
