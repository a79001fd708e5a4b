"""The host swap pool's size: configured, or a default for policies that swap.

``backend.num_swap_blocks`` or ``backend.swap_space_gb`` set = exactly that (0 is an explicit
"no pool", which a swapping policy warns about). Both null = no pool, unless the preemption
policy uses one (``uses_host_pool = True`` on its class: ``swap``, ``adaptive``); then
``DEFAULT_SWAP_SPACE_GB`` (vLLM's ``swap_space`` default), capped at ``FREE_FRACTION`` of the
host memory free now (``backend=torch`` only: the simulator allocates nothing).
"""

from __future__ import annotations

import logging
import os

from omegaconf import DictConfig

log = logging.getLogger(__name__)

DEFAULT_SWAP_SPACE_GB = 4.0
FREE_FRACTION = 0.5


def host_free_bytes() -> int | None:
    """Host memory available now (``MemAvailable``, or the cgroup's limit left if lower); None if unknown."""
    free = None
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    free = int(line.split()[1]) * 1024
    except OSError:
        try:
            free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError, AttributeError):
            return None
    try:  # cgroup v2: a container's limit is below what the host reports
        with open("/sys/fs/cgroup/memory.max") as fh, open("/sys/fs/cgroup/memory.current") as cur:
            limit = fh.read().strip()
            if limit != "max":
                left = int(limit) - int(cur.read())
                free = left if free is None else min(free, left)
    except (OSError, ValueError):
        pass
    return free


def swap_pool_config(cfg: DictConfig, uses_host_pool: bool) -> tuple[int, float | None]:
    """``(num_swap_blocks, swap_space_gb)`` for the executor (it turns GiB into blocks)."""
    backend = cfg.backend
    if backend.get("num_swap_blocks") is not None:
        return backend.num_swap_blocks, None
    if backend.get("swap_space_gb") is not None:
        return 0, backend.swap_space_gb
    if not uses_host_pool:
        return 0, None
    gb = DEFAULT_SWAP_SPACE_GB
    if backend.name != "sim":
        free = host_free_bytes()
        if free is not None and FREE_FRACTION * free / 2**30 < gb:
            gb = FREE_FRACTION * free / 2**30
            log.info("host swap pool capped to %.2f GiB (half the free host memory)", gb)
    return 0, gb
