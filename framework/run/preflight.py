"""Checks of a run's requests against its stack before the first step.

``strict_requests=true`` turns any request the engine would reject into a start-up error, and
``scheduler=slo_aware`` with no TTFT/TPOT target anywhere (run-wide ``slo.*`` or per request)
warns: it would then order by nothing and its attainment figures would be n/a.
"""

from __future__ import annotations

import logging
from typing import Iterable

from omegaconf import DictConfig

from servelab.engine.engine import Engine
from servelab.core.errors import ConfigError
from servelab.core.request import Request

log = logging.getLogger(__name__)


def check_requests(cfg: DictConfig, engine: Engine, requests: Iterable[Request]) -> None:
    """Raise :class:`ConfigError` (``strict_requests``) or warn (``slo_aware`` without targets)."""
    strict = bool(cfg.get("strict_requests", False))
    slo_aware = cfg.scheduler.name == "slo_aware"
    if not strict and not slo_aware:
        return
    run_targets = cfg.slo.ttft_ms is not None or cfg.slo.tpot_ms is not None
    any_target, bad, first = run_targets, 0, None
    total = 0
    for request in requests:
        total += 1
        any_target = any_target or request.ttft_slo_ms is not None or request.tpot_slo_ms is not None
        if strict:
            reason = engine.rejection_reason(request)
            if reason is not None:
                bad += 1
                first = first or (request.id, reason)
    if bad:
        rid, reason = first
        raise ConfigError(f"strict_requests=true: request {rid!r} would be rejected: {reason} "
                          f"({bad} of {total} requests would be)")
    if slo_aware and not any_target:
        log.warning("scheduler=slo_aware but no request has a TTFT or TPOT target: set slo.ttft_ms / slo.tpot_ms "
                    "(or ttft_slo_ms / tpot_slo_ms per request); without one it has nothing to schedule by and "
                    "SLO attainment and goodput are n/a")
