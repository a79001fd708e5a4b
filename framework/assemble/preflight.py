"""Checks of a run's requests against its stack before the first step.

A KV pool too small for every request of the workload is a start-up error naming
``num_kv_blocks`` and the minimum (instead of each arrival being rejected in turn);
``strict_requests=true`` turns any request the engine would reject into a start-up error, and
``scheduler=slo_aware`` with no TTFT/TPOT target anywhere (run-wide ``slo.*`` or per request)
warns: it would then order by nothing and its attainment figures would be n/a. ``backend.device``
is checked before anything is built (:func:`check_device`): a name torch does not know, or CUDA on a
machine without it, is one line rather than a traceback from the model loader.
"""

from __future__ import annotations

import logging
import re
from typing import Iterable

from omegaconf import DictConfig

from servelab.engine.engine import Engine
from servelab.core.errors import ConfigError
from servelab.core.request import Request

log = logging.getLogger(__name__)
_DEVICE = re.compile(r"^(auto|cpu|cuda(:\d+)?)$")


def check_device(cfg: DictConfig) -> None:
    """Raise :class:`ConfigError` for a ``backend.device`` that is not ``auto | cpu | cuda | cuda:N``,
    or names a CUDA device this machine does not have (``backend=sim`` runs no tensors: only the
    spelling is checked there)."""
    device = str(cfg.backend.get("device", "auto"))
    if not _DEVICE.match(device):
        raise ConfigError(f"backend.device={device} is not a device: use auto, cpu, cuda or cuda:N")
    if not device.startswith("cuda") or cfg.backend.get("name") == "sim":
        return
    import torch  # noqa: PLC0415 - only a CUDA device needs it

    if not torch.cuda.is_available():
        build = "a CPU-only build" if torch.version.cuda is None else f"CUDA {torch.version.cuda}, no GPU visible"
        raise ConfigError(f"backend.device={device} but CUDA is not available on this machine (torch "
                          f"{torch.__version__}, {build}): use backend.device=cpu or auto")
    index, count = int(device.partition(":")[2] or 0), torch.cuda.device_count()
    if index >= count:
        raise ConfigError(f"backend.device={device} but this machine has {count} CUDA device(s): "
                          f"cuda:0..cuda:{count - 1}")


def check_requests(cfg: DictConfig, engine: Engine, requests: Iterable[Request]) -> None:
    """Raise :class:`ConfigError` (a KV pool that holds no request; ``strict_requests``) or warn
    (``slo_aware`` without targets)."""
    if iter(requests) is requests:  # a one-shot iterator: the checks below each read the requests
        requests = list(requests)
    check_pool_holds_a_request(cfg, engine, requests)
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
        assert first is not None
        rid, reason = first
        raise ConfigError(f"strict_requests=true: request {rid!r} would be rejected: {reason} "
                          f"({bad} of {total} requests would be)")
    if slo_aware and not any_target:
        log.warning("scheduler=slo_aware but no request has a TTFT or TPOT target: set slo.ttft_ms / slo.tpot_ms "
                    "(or ttft_slo_ms / tpot_slo_ms per request); without one it has nothing to schedule by and "
                    "SLO attainment and goodput are n/a")


def check_pool_holds_a_request(cfg: DictConfig, engine: Engine, requests: Iterable[Request]) -> None:
    """A KV pool smaller than every request's minimum would reject each one as it arrives and
    report it only at the end: say so at start-up, naming ``num_kv_blocks`` and the minimum.
    Requests rejected for another reason (empty, too long, no tokens to generate) are left to it.
    Reads the requests only up to the first that fits (a lazy workload is not made twice)."""
    limits, allocator = engine.limits, engine.allocator
    smallest = None
    for request in requests:
        if request.prompt_len == 0 or request.max_tokens < 1 or request.prompt_len >= limits.max_model_len:
            continue
        needed = min(request.prompt_len + request.max_tokens, limits.max_model_len)
        if allocator.can_ever_fit(needed):
            return
        if smallest is None or needed < smallest[0]:
            smallest = (needed, request.id)
    if smallest is None:
        return
    needed, rid = smallest
    blocks = -(-needed // limits.block_size)
    pool = (f"num_kv_blocks={cfg.num_kv_blocks}" if cfg.get("num_kv_blocks") is not None
            else f"num_kv_blocks=null (sized from memory: {allocator.num_blocks} blocks)")
    raise ConfigError(f"{pool} holds no request of this workload: the smallest ({rid!r}: {needed} tokens with its "
                      f"output) needs at least {blocks} blocks of {limits.block_size}; set num_kv_blocks>={blocks}")
