"""The host swap pool's size: configured, or a default for policies that swap.

``backend.num_swap_blocks`` or ``backend.swap_space_gb`` set = exactly that (0 is an explicit
"no pool", which a swapping policy warns about). Both null = no pool, unless the preemption
policy uses one (``uses_host_pool = True`` on its class: ``swap``, ``adaptive``); then
``DEFAULT_SWAP_SPACE_GB`` (vLLM's ``swap_space`` default), capped at ``FREE_FRACTION`` of the
host memory free now (``backend=torch`` only: the simulator allocates nothing).

With tiers on (a host tier below the GPU and a ``kv_tier_policy`` that stores) the swap pool and the
host tier are one host memory (:mod:`servelab.kv.tiers.host_memory`): a pool is the host tier's
``capacity_gib``, and a size of its own (``backend.num_swap_blocks`` / ``swap_space_gb`` above 0) is
refused in one line. With tiers off nothing here changes.
"""

from __future__ import annotations

import logging
import os

from omegaconf import DictConfig

from servelab.core.errors import ConfigError

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


def swap_pool_config(cfg: DictConfig, uses_host_pool: bool,
                     host_tier: tuple[int, float] | None = None) -> tuple[int, float | None]:
    """``(num_swap_blocks, swap_space_gb)`` for the executor (it turns GiB into blocks);
    ``host_tier``: ``(index, capacity_gib)`` of the host tier the pool shares its memory with (tiers on)."""
    backend = cfg.backend
    if host_tier is not None:
        index, gib = host_tier
        for key in ("num_swap_blocks", "swap_space_gb"):
            if backend.get(key):
                raise ConfigError(f"backend.{key}={backend[key]} with kv_tiers={cfg.kv_tiers.name}: swap-out and the "
                                  f"host tier share one host memory, sized by kv_tiers.tiers.{index}.capacity_gib={gib}; "
                                  f"drop backend.{key}")
        explicit_none = backend.get("num_swap_blocks") == 0 or backend.get("swap_space_gb") == 0
        return (0, None) if explicit_none or not uses_host_pool else (0, gib)
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
