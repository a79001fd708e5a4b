"""The Hydra entry point behind ``run.py`` (and the ``servelab`` console script)."""

from __future__ import annotations

import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach for a hub at run time

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from .config import register_configs
from .errors import ServelabError
from .registry import PluginError


@hydra.main(config_path="conf", config_name="config", version_base="1.3")
def _hydra_main(cfg: DictConfig) -> float | None:
    from .report import print_samples, print_summary
    from .session import run_job

    hydra_cfg = HydraConfig.get()
    output_dir = hydra_cfg.runtime.output_dir
    try:
        result = run_job(cfg, output_dir)
    except ServelabError as exc:
        print(f"servelab: error: {exc}", file=sys.stderr)
        if hydra_cfg.mode == RunMode.MULTIRUN:
            # Let Hydra mark this job failed: the other jobs of the sweep (in this process or in a
            # launcher's workers) still run, and the sweep fails once they are done.
            raise
        sys.exit(2)
    print_samples(result.iter_requests())
    print_summary(result.summary, output_dir)
    return result.summary.get("output_throughput_tok_s")


# ``servelab <subcommand> [hydra overrides]``: each entry is "module:function" under servelab,
# called with the remaining arguments (Hydra overrides) and returning an exit code.
SUBCOMMANDS: dict[str, str] = {
    "profile": "profiling:profile_main",
    "eval-ppl": "eval_ppl:main",  # held-out perplexity of the configured checkpoint (ppl.json)
}


def main() -> None:
    """Register every plugin's config with Hydra, then run a subcommand or compose and run a job."""
    try:
        register_configs()
    except PluginError as exc:
        print(f"servelab: plugin error: {exc}", file=sys.stderr)
        sys.exit(2)
    if len(sys.argv) > 1 and sys.argv[1] in SUBCOMMANDS:
        import importlib

        module, func = SUBCOMMANDS[sys.argv[1]].split(":")
        try:
            code = getattr(importlib.import_module(f"servelab.{module}"), func)(sys.argv[2:])
        except ServelabError as exc:
            print(f"servelab {sys.argv[1]}: error: {exc}", file=sys.stderr)
            code = 2
        sys.exit(code)
    _hydra_main()

