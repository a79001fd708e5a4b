"""``servelab serve`` shutting down on SIGTERM with streams in flight: they get
``serve.shutdown_grace_s`` to finish, the rest are aborted (the client sees its stream end), and
the result files are written with nothing leaked. And the one-line refusal of the simulator."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading

import httpx
import pytest

pytest.importorskip("fastapi", reason="the serve extra (pip install servelab[serve]) is not installed")

from serve_helpers import start, wait_until


def test_sigterm_aborts_what_outlives_the_grace_period_and_writes_results(tmp_path):
    # one seat: four 480-token streams take several seconds one after the other, far beyond 0.5 s of grace
    server = start(tmp_path / "results", "max_num_seqs=1", "serve.shutdown_grace_s=0.5")
    streams: list[list[str]] = []

    def consume():
        lines: list[str] = []
        streams.append(lines)
        try:
            with httpx.stream("POST", f"{server.base_url}/v1/completions", timeout=120,
                              json={"prompt": "x", "max_tokens": 480, "stream": True, "ignore_eos": True}) as r:
                lines.extend(line for line in r.iter_lines() if line)
        except httpx.HTTPError as exc:  # the server closed the connection mid-stream
            lines.append(f"closed: {type(exc).__name__}")

    threads = [threading.Thread(target=consume) for _ in range(4)]
    for t in threads:
        t.start()
    def queued():
        m = server.metrics()
        return (m['vllm:num_requests_running{model_name="tiny_code"}'],
                m['vllm:num_requests_waiting{model_name="tiny_code"}']) == (1, 3)

    wait_until(queued, "one request running and three waiting")
    assert server.stop(signal.SIGTERM) == 0, server.output()
    for t in threads:
        t.join(60)
    summary = server.summary()
    assert summary["status"] == "completed", summary["status"]
    assert summary["leaked_blocks"] == 0 and summary["num_unfinished"] == 0
    assert summary["num_requests"] == 4 and summary["num_aborted"] >= 1
    assert summary["num_finished"] + summary["num_aborted"] == 4
    assert len(server.records()) == 4
    for lines in streams:  # every client saw its stream end: finished or aborted, or at worst closed
        assert lines and (lines[-1] == "data: [DONE]" or lines[-1].startswith("closed")), lines[-3:]
    assert "shutting down" in server.output() and "leaked blocks 0" in server.output()


def test_the_simulator_is_refused_with_one_line(tmp_path):
    proc = subprocess.run([sys.executable, "-c", "from servelab.cli.main import main; main()", "serve", "backend=sim",
                           "logger=none"], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert proc.returncode == 2
    errors = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and "needs the wall clock" in errors[0], proc.stderr
