"""Multirun bookkeeping: ``experiment=`` option names, job folder names (``safe_dirname``), and the
Hydra callback that reports a sweep's failed jobs (:class:`SweepReport`)."""

from __future__ import annotations

import difflib
import hashlib
import sys
import time
from importlib import resources
from pathlib import Path
from typing import Any, ClassVar

from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from servelab.core.errors import ConfigError


def experiment_names() -> list[str]:
    """``experiment=`` options: ``conf/experiment/**.yaml`` as ``name`` or ``folder/name``."""
    root = resources.files("servelab.conf") / "experiment"
    names: list[str] = []

    def walk(folder: Any, prefix: str) -> None:
        for entry in folder.iterdir():
            if entry.is_dir() and not entry.name.startswith(("_", ".")):
                walk(entry, f"{prefix}{entry.name}/")
            elif entry.name.endswith(".yaml"):
                names.append(prefix + entry.name[:-5])

    walk(root, "")
    return sorted(names)


def check_experiment_option(values: list[str]) -> None:
    """``experiment=<name>`` is optional in the defaults list, so Hydra skips a name that does not
    exist without a word: refuse it in one line with the options."""
    names = experiment_names()
    for value in values:
        if value not in names and value not in ("null", "None", ""):
            close = difflib.get_close_matches(value, names, n=1, cutoff=0.6)
            hint = f" did you mean '{close[0]}'?" if close else ""
            raise ConfigError(f"unknown experiment option '{value}';{hint} options: {', '.join(names)}")


def safe_dirname(text: Any, limit: int = 100) -> str:
    """A multirun job's folder name from its ``override_dirname``: ``/`` replaced (a path in a
    value would nest folders) and, past ``limit`` bytes, cut there plus ``-`` and an 8-hex hash of
    the whole (distinct sweeps keep distinct names; the OS limit is 255 bytes)."""
    text = str(text).replace("/", "_").replace("\\", "_")
    data = text.encode("utf-8")
    if len(data) <= limit:
        return text
    digest = hashlib.sha1(data).hexdigest()[:8]
    return f"{data[:limit].decode('utf-8', errors='ignore')}-{digest}"


ERROR_FILE = "error.txt"  # a failed run's one-line error, in its folder (servelab compare shows it)


class SweepReport(Callback):
    """``hydra.callbacks.sweep_report`` (conf/config.yaml): at the end of a multirun, in the launching
    process, one line naming the jobs that failed (each left ``error.txt`` in its folder), then
    ``results: <sweep dir>``; the sweep then exits 1."""

    failed: ClassVar[list[str]] = []  # the last sweep's failed jobs (main() exits 1 on them)

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        self.sweep_dir = Path(str(config.hydra.sweep.dir))
        self.start = time.time() - 1  # file times have coarse resolution on some file systems

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        def this_sweep(path: Path) -> bool:  # a folder of an earlier sweep into the same dir is not counted
            return path.is_file() and path.stat().st_mtime >= self.start

        jobs = [p for p in self.sweep_dir.iterdir() if this_sweep(p / ".hydra" / "hydra.yaml")] \
            if self.sweep_dir.is_dir() else []
        failed = sorted(p.name for p in jobs if this_sweep(p / ERROR_FILE))
        SweepReport.failed = failed
        if failed:
            print(f"servelab: error: {len(failed)} of {max(len(jobs), len(failed))} jobs failed: {', '.join(failed)} "
                  f"(each one's error is in its {ERROR_FILE}); the others' results are kept", file=sys.stderr,
                  flush=True)
        print(f"results: {self.sweep_dir}", flush=True)


# ``hydra.sweep.subdir`` in conf/config.yaml; registered on import, so a launcher's worker process
# (which imports this module with the task function) resolves it too.
OmegaConf.register_new_resolver("servelab_dirname", safe_dirname, replace=True)
