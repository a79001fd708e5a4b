"""Start ``servelab serve`` in a subprocess on 127.0.0.1 with an ephemeral port, for the server tests.

The server prints ``listening on http://HOST:PORT`` once it accepts connections; :func:`start`
waits for that line (generous timeout, the process's output in the failure message). :meth:`stop`
sends a signal and returns the exit code; the result files are then in ``output_dir``.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

START_TIMEOUT_S = 180  # loading torch and the model on a busy 2-core box
STOP_TIMEOUT_S = 120
TEST_DEFAULTS = ("model=tiny_code", "logger=none", "backend.num_threads=1")


class ServerProcess:
    def __init__(self, proc: subprocess.Popen, output_dir: Path, api_key: str | None) -> None:
        self.proc, self.output_dir, self.api_key = proc, output_dir, api_key
        self.lines: list[str] = []
        self.base_url = ""
        self._ready = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.append(line)
            match = re.search(r"listening on (http://[\d.]+:\d+)", line)
            if match:
                self.base_url = match.group(1)
                self._ready.set()
        self._ready.set()  # the process ended

    def output(self) -> str:
        return "".join(self.lines)

    def headers(self) -> dict:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def client(self, **kwargs) -> httpx.Client:
        return httpx.Client(base_url=self.base_url, headers=self.headers(), timeout=kwargs.pop("timeout", 120),
                            **kwargs)

    def metrics(self) -> dict[str, float]:
        """``/metrics`` as ``{'name{labels}': value}`` (labels as printed)."""
        text = httpx.get(f"{self.base_url}/metrics", timeout=60).text
        out = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                key, value = line.rsplit(" ", 1)
                out[key] = float(value)
        return out

    def stop(self, sig=signal.SIGINT) -> int:
        """Signal the server and wait for it to write its results and exit."""
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            return self.proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise AssertionError(f"the server did not exit within {STOP_TIMEOUT_S} s of {sig!r}:\n{self.output()}")

    def summary(self) -> dict:
        path = self.output_dir / "summary.json"
        assert path.is_file(), f"no summary.json in {self.output_dir}:\n{self.output()}"
        return json.loads(path.read_text())

    def records(self) -> list[dict]:
        return [json.loads(line) for line in (self.output_dir / "requests.jsonl").read_text().splitlines()]


def start(output_dir: Path, *overrides: str, api_key: str | None = None) -> ServerProcess:
    """``servelab serve --port 0`` with ``overrides`` (the test defaults unless overridden)."""
    chosen = {o.split("=", 1)[0] for o in overrides}
    args = [*overrides, *(d for d in TEST_DEFAULTS if d.split("=", 1)[0] not in chosen),
            f"serve.output_dir={output_dir}"]
    cmd = [sys.executable, "-c", "from servelab.cli.main import main; main()", "serve", "--port", "0", *args]
    if api_key:
        cmd += ["--api-key", api_key]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=output_dir.parent,
                            env=env)
    server = ServerProcess(proc, output_dir, api_key)
    if not server._ready.wait(START_TIMEOUT_S) or not server.base_url:
        proc.kill()
        raise AssertionError(f"servelab serve did not start within {START_TIMEOUT_S} s:\n{server.output()}")
    return server


def wait_until(predicate, what: str, timeout_s: float = 60.0, every_s: float = 0.05):
    """Poll ``predicate`` until it returns something truthy (returned); fail naming ``what``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(every_s)
    raise AssertionError(f"{what}: not within {timeout_s} s")
