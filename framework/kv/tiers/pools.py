"""The real bytes of the KV tiers below the GPU, on an engine that computes tokens.

Each tier has ``num_blocks`` slots, a slot holding one device block's K and V over all layers
(``KVPool.data[:, :, block]``, scales too for a quantised cache): a ``host`` tier in this process's
memory, a slot allocated when first written (a 64 GiB tier costs what it holds), a ``disk`` tier a
file ``kv_tier_<i>.bin`` in ``disk_dir`` (a run's ``<run dir>/kv_tier_disk``, else a temporary folder)
mapped into memory (``torch.from_file``; sparse until written, the OS pages it in and out). The tiered store
(:mod:`servelab.kv.tiers.store`) decides which slot holds which block and calls these copies:

- :meth:`save`: a device block into a tier slot (a write-back before the block is reused, or a
  write-through of a finished request's block, still intact);
- :meth:`load`: a tier slot into a device block (before the forward pass that reads it);
- :meth:`move`: a slot of one tier into a slot of another (a demotion).

Copies are synchronous: the bytes are in place when the call returns. The store queues them and
runs them in its worker-side calls (``start_load_kv`` before each forward pass, ``save_kv`` after
each step), in the order it decided them.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Callable, Sequence as Seq

import torch

from servelab.core.errors import ConfigError
from servelab.core.kv_tiers import TierSpec
from servelab.exec.kv_pool import KVPool


class _HostSlots(dict):
    """Slot -> tensor, each made on its first write."""

    def __init__(self, shape: tuple[int, ...], dtype: torch.dtype) -> None:
        super().__init__()
        self.shape, self.dtype = shape, dtype

    def __missing__(self, slot: int) -> torch.Tensor:
        tensor = self[slot] = torch.empty(self.shape, dtype=self.dtype)
        return tensor


def _slots(shape: tuple[int, ...], dtype: torch.dtype, num_blocks: int, path: Path | None):
    if path is None:
        return _HostSlots(shape, dtype)
    full = (num_blocks, *shape)
    numel = 1
    for n in full:
        numel *= n
    return torch.from_file(str(path), shared=True, size=numel, dtype=dtype).view(full)


class _PoolBlocks:
    """Slot -> block ``slot`` of a host pool's tensor (``[L, 2, N, ...]``): the host tier's slots when it
    shares the swap pool's memory (servelab.kv.tiers.host_memory)."""

    def __init__(self, tensor: torch.Tensor) -> None:
        self.tensor = tensor

    def __getitem__(self, slot: int) -> torch.Tensor:
        return self.tensor[:, :, slot]


class TierPools:
    """One tensor per tier (and one for its scales when the cache is quantised); ``host_pool``: the
    swap pool a host tier shares (its slots are that pool's blocks)."""

    def __init__(self, device_pool: KVPool, tiers: Seq[TierSpec], disk_dir: str | None,
                 host_pool: KVPool | None = None) -> None:
        self.device = device_pool
        self._temporary_dir: str | None = None
        block = device_pool.data[:, :, 0]
        scale = device_pool.scales[:, :, 0] if device_pool.scales is not None else None
        if any(t.kind == "disk" for t in tiers):
            if not disk_dir:  # a stack built outside a run (servelab.LLM, a test): a folder of its own
                disk_dir = self._temporary_dir = tempfile.mkdtemp(prefix="servelab-kv-tier-")
            folder = Path(disk_dir)
            try:
                folder.mkdir(parents=True, exist_ok=True)
                probe = folder / ".servelab_write_probe"
                probe.write_bytes(b"")
                probe.unlink()
            except OSError as exc:
                raise ConfigError(f"kv_tiers.disk_dir={disk_dir}: not writable ({exc.strerror or exc})") from None
        self.data: list = []  # per tier: a tensor [slots, ...] (disk) or a _HostSlots (host)
        self.scales: list = []
        for i, tier in enumerate(tiers):
            if tier.kind == "host" and host_pool is not None:
                self.data.append(_PoolBlocks(host_pool.data))
                self.scales.append(None if host_pool.scales is None else _PoolBlocks(host_pool.scales))
                continue
            path = Path(disk_dir) / f"kv_tier_{i}.bin" if tier.kind == "disk" and disk_dir else None
            self.data.append(_slots(tuple(block.shape), block.dtype, tier.num_blocks, path))
            scale_path = path.with_suffix(".scales.bin") if path is not None else None
            self.scales.append(None if scale is None else
                               _slots(tuple(scale.shape), scale.dtype, tier.num_blocks, scale_path))
        self.paths = [Path(disk_dir) / f"kv_tier_{i}.bin" for i, t in enumerate(tiers)
                      if t.kind == "disk" and disk_dir]

    def save(self, tier: int, slot: int, block: int) -> None:
        self.data[tier][slot].copy_(self.device.data[:, :, block])
        scales = self.scales[tier]
        if scales is not None and self.device.scales is not None:
            scales[slot].copy_(self.device.scales[:, :, block])

    def load(self, tier: int, slot: int, block: int) -> None:
        self.device.data[:, :, block].copy_(self.data[tier][slot])
        scales = self.scales[tier]
        if scales is not None and self.device.scales is not None:
            self.device.scales[:, :, block].copy_(scales[slot])

    def move(self, tier: int, slot: int, to_tier: int, to_slot: int) -> None:
        self.data[to_tier][to_slot].copy_(self.data[tier][slot])
        scales, to_scales = self.scales[tier], self.scales[to_tier]
        if scales is not None and to_scales is not None:
            to_scales[to_slot].copy_(scales[slot])

    def close(self) -> None:
        """Drop the tensors and the disk files."""
        self.data.clear()
        self.scales.clear()
        for path in self.paths:
            for p in (path, path.with_suffix(".scales.bin")):
                if p.exists():
                    os.unlink(p)
        for folder in {path.parent for path in self.paths}:
            try:
                folder.rmdir()  # only when empty: a folder the user named may hold other files
            except OSError:
                pass
        if self._temporary_dir is not None:
            shutil.rmtree(self._temporary_dir, ignore_errors=True)


def tier_pools(kv_pool: object, tiers: Seq[TierSpec], disk_dir: str | None,
               at_close: Callable[[Callable[[], None]], object] | None = None, host_pool: object = None) -> TierPools:
    """The pools of the tiers below ``kv_pool`` (an executor's public ``kv_pool``: one worker in this
    process, ``backend=local`` or ``backend=torch`` with ``tensor_parallel_size=1``); ``at_close``
    registers their release with the executor's shutdown."""
    if not isinstance(kv_pool, KVPool):
        raise ConfigError("kv_tiers on a real engine need one worker in this process (backend=local, or "
                          "backend=torch with tensor_parallel_size=1)")
    pools = TierPools(kv_pool, tiers, disk_dir, host_pool if isinstance(host_pool, KVPool) else None)
    if at_close is not None:
        at_close(pools.close)
    return pools
