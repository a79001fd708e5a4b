"""The Hydra entry point behind ``run.py`` (and the ``servelab`` console script)."""

from __future__ import annotations

import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach for a hub at run time

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

from .config import register_configs
from .errors import ServelabError
from .registry import PluginError


@hydra.main(config_path="conf", config_name="config", version_base="1.3")
def _hydra_main(cfg: DictConfig) -> float | None:
    from .report import print_summary
    from .session import run_job

    output_dir = HydraConfig.get().runtime.output_dir
    try:
        result = run_job(cfg, output_dir)
    except ServelabError as exc:
        print(f"servelab: error: {exc}", file=sys.stderr)
        sys.exit(2)
    print_summary(result.summary, output_dir)
    return result.summary.get("output_throughput_tok_s")


def main() -> None:
    """Register every plugin's config with Hydra, then let Hydra compose and run."""
    try:
        register_configs()
    except PluginError as exc:
        print(f"servelab: plugin error: {exc}", file=sys.stderr)
        sys.exit(2)
    _hydra_main()
