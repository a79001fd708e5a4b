"""The ``servelab serve`` processes ``servelab route replicas=N`` starts: each on a free local port
(``--port 0``; the port is read from its ``listening on`` line), each writing its result files to
``<route.output_dir>/replica<i>``. They start together; :func:`start_replicas` returns once every one
listens, or stops them all and raises :class:`ConfigError` with the first failure's last line. On
Linux each child gets SIGTERM if the router process dies (``PR_SET_PDEATHSIG``), so even a killed
router leaves no orphan replica; :meth:`ReplicaProcess.stop` is the orderly way (SIGINT: the replica
finishes or aborts what it holds and writes its results).
"""

from __future__ import annotations

import ctypes
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from pathlib import Path

from servelab.core.errors import ConfigError

_LISTENING = re.compile(r"listening on (https?://[^\s]+:\d+)")
STOP_GRACE_S = 30.0


def _die_with_parent() -> None:  # runs in the child between fork and exec
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass  # not Linux: stop() and the router's signal handlers still stop them


class ReplicaProcess:
    """One started ``servelab serve``; its output is drained into :attr:`tail` (the last lines)."""

    def __init__(self, index: int, proc: subprocess.Popen, output_dir: Path) -> None:
        self.index, self.proc, self.output_dir = index, proc, output_dir
        self.url = ""
        self.tail: deque[str] = deque(maxlen=40)
        self._ready = threading.Event()
        threading.Thread(target=self._drain, daemon=True, name=f"replica{index}-output").start()

    def _drain(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.tail.append(line.rstrip())
            match = _LISTENING.search(line)
            if match and not self.url:
                self.url = match.group(1)
                self._ready.set()
        self._ready.set()  # it ended

    def wait_ready(self, deadline: float) -> str | None:
        """None once it listens; else why not (it exited, or the deadline passed)."""
        self._ready.wait(max(0.0, deadline - time.monotonic()))
        if self.url:
            return None
        if self.proc.poll() is not None:
            last = next((line for line in reversed(self.tail) if line.strip()), "no output")
            return f"replica {self.index} exited with code {self.proc.returncode} at start-up: {last}"
        return f"replica {self.index} did not listen within route.start_timeout_s"

    def stop(self, grace_s: float = STOP_GRACE_S) -> int | None:
        """SIGINT, then SIGKILL after ``grace_s``; the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode

    def kill(self) -> None:
        """SIGKILL at once (tests: a backend that dies)."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def start_replicas(n: int, overrides: list[str], output_dir: Path, timeout_s: float) -> list[ReplicaProcess]:
    """``n`` replicas of the stack ``overrides`` describe, listening on 127.0.0.1."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"}
    replicas: list[ReplicaProcess] = []
    try:
        for i in range(n):
            out = output_dir / f"replica{i}"
            cmd = [sys.executable, "-c", "from servelab.cli.main import main; main()", "serve", "--host",
                   "127.0.0.1", "--port", "0", *overrides, f"serve.output_dir={out}"]
            proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    text=True, env=env, preexec_fn=_die_with_parent, start_new_session=True)
            replicas.append(ReplicaProcess(i, proc, out))
        deadline = time.monotonic() + timeout_s
        for r in replicas:
            problem = r.wait_ready(deadline)
            if problem:
                raise ConfigError(problem)
    except BaseException:
        stop_replicas(replicas, grace_s=5.0)
        raise
    return replicas


def stop_replicas(replicas: list[ReplicaProcess], grace_s: float = STOP_GRACE_S) -> None:
    """Signal them all first, then wait for each (they shut down in parallel)."""
    for r in replicas:
        if r.proc.poll() is None:
            r.proc.send_signal(signal.SIGINT)
    for r in replicas:
        r.stop(grace_s)
