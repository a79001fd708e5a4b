"""The simulator half of the MoE kits (``expert_placement``, ``expert_cache``): one short run twice, every
request finished and the two runs' MoE and latency figures equal."""

from __future__ import annotations

import json
import tempfile
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from servelab.kit.conformance import Failure


def check_two_runs(overrides: tuple[str, ...], registry, *, raised: str, unfinished: str,
                   differ: str) -> "Failure | None":
    """Run ``overrides`` twice on ``registry``'s plugins. A run that raises fails contract ``raised`` (the
    plugin's error is the finding), one that leaves requests unfinished ``unfinished``, two runs whose
    figures differ ``differ``."""
    from servelab.kit.conformance import Failure  # noqa: PLC0415 - the kit's module imports this one by name

    run = " ".join(overrides)
    try:
        first, again = _figures(overrides, registry), _figures(overrides, registry)
    except Exception as exc:  # noqa: BLE001 - the plugin's error is the finding
        return Failure(raised, f"{type(exc).__name__}: {exc} (run: {run})")
    if first[0] != first[1]:
        return Failure(unfinished, f"{first[0] - first[1]} of {first[0]} requests did not finish (run: {run})")
    if first != again:
        return Failure(differ, f"two runs of {run} differ")
    return None


def _figures(overrides: tuple[str, ...], registry) -> tuple[int, int, str]:
    """(requests, finished, the run's MoE and latency figures as JSON)."""
    from servelab.api import compose  # noqa: PLC0415
    from servelab.assemble.stack import build_stack  # noqa: PLC0415
    from servelab.run.session import run_job  # noqa: PLC0415

    cfg = compose(list(overrides))
    with tempfile.TemporaryDirectory() as out:
        s = run_job(cfg, out, stack=build_stack(cfg, registry)).summary
    figures = {k: v for k, v in s.items() if k.startswith("moe") or k in ("tpot_ms", "ttft_ms", "duration_s")}
    return s["num_requests"], s["num_finished"], json.dumps(figures, sort_keys=True, default=str)
