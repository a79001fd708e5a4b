"""The Hydra entry point behind ``run.py`` (and the ``servelab`` console script)."""

from __future__ import annotations

import importlib
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach for a hub at run time

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from servelab.cli.help import help_text
from servelab.core.errors import ServelabError
from servelab.core.registry import PluginError, check_selection
from servelab.run.config import register_configs


_current_output_dir: str | None = None  # the running job's folder, for the Ctrl-C line


@hydra.main(config_path="pkg://servelab.conf", config_name="config", version_base="1.3")
def _hydra_main(cfg: DictConfig) -> float | None:
    from servelab.run.report import all_rejected_error, print_samples, print_summary  # noqa: PLC0415 - rich
    from servelab.run.session import run_job  # noqa: PLC0415 - torch

    global _current_output_dir
    hydra_cfg = HydraConfig.get()
    output_dir = _current_output_dir = hydra_cfg.runtime.output_dir
    multirun = hydra_cfg.mode == RunMode.MULTIRUN
    try:
        result = run_job(cfg, output_dir, banner=True)
        print_samples(result.iter_requests())
        print_summary(result.summary, output_dir)
        error = all_rejected_error(result.summary)
        if error:
            raise ServelabError(error)
    except ServelabError as exc:
        print(f"servelab: error: {exc}", file=sys.stderr)
        if multirun:
            # Let Hydra mark this job failed: the other jobs of the sweep (in this process or in a
            # launcher's workers) still run, and the sweep fails once they are done.
            raise
        sys.exit(2)
    return result.summary.get("output_throughput_tok_s")


def _interrupted() -> None:
    """Ctrl-C: one line saying what was kept (the session wrote the partial results), exit 130."""
    done = _current_output_dir and os.path.isfile(os.path.join(_current_output_dir, "summary.json"))
    if done:
        print(f"interrupted; partial results written to {_current_output_dir}", file=sys.stderr)
    else:
        print("interrupted before the run started; nothing written", file=sys.stderr)
    sys.exit(130)


# ``servelab <subcommand> [hydra overrides]``: each entry is "module:function" under servelab,
# called with the remaining arguments (Hydra overrides) and returning an exit code.
SUBCOMMANDS: dict[str, str] = {
    "profile": "cli.profile:profile_main",  # fit a step-time profile of the real engine on this machine
    "profile-ops": "cli.profile_ops:main",  # operator tables (docs/op-tables.md) measured on this machine
    "eval-ppl": "cli.eval_ppl:main",  # held-out perplexity of the configured checkpoint (ppl.json)
    "compare": "cli.compare:main",  # runs side by side: a table of metrics and the keys that differ, a plot
    "check-plugin": "kit.conformance:main",  # a plugin through the conformance kit: exit 0 only when it passes
    "new-plugin": "kit.new_plugin:main",  # a plugin package skeleton: entry point, typed Config, a passing test
    "grade": "kit.grading:main",  # plugins scored against the built-ins on fixed simulated workloads
    "serve": "serve.command:main",  # an OpenAI-compatible server (FastAPI + uvicorn) in front of the composed stack
}


def main() -> None:
    """Register every plugin's config with Hydra, then run a subcommand or compose and run a job."""
    try:
        register_configs()
        check_selection(sys.argv[1:])  # a plugin of a package that failed to import: say so
    except PluginError as exc:
        print(f"servelab: plugin error: {exc}", file=sys.stderr)
        sys.exit(2)
    if any(a in ("--help", "-h") for a in sys.argv[1:2]):
        print(help_text(sys.argv[2:]), end="")  # the usage page with the values the run would use
        sys.exit(0)
    if len(sys.argv) > 1 and sys.argv[1] in SUBCOMMANDS:
        module, func = SUBCOMMANDS[sys.argv[1]].split(":")
        try:
            code = getattr(importlib.import_module(f"servelab.{module}"), func)(sys.argv[2:])
        except ServelabError as exc:
            print(f"servelab {sys.argv[1]}: error: {exc}", file=sys.stderr)
            code = 2
        except KeyboardInterrupt:
            print(f"servelab {sys.argv[1]}: interrupted", file=sys.stderr)
            code = 130
        sys.exit(code)
    try:
        _hydra_main()
    except KeyboardInterrupt:
        _interrupted()

