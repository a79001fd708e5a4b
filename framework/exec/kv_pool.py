"""The KV tensors of one rank: every layer's K and V blocks, and their scales when the cache is quantised.

``kv_cache_dtype=auto`` stores K/V in the model's dtype; ``int8`` / ``fp8_e4m3`` store 1-byte values
plus one float32 scale per (token, KV head) (see :mod:`servelab.kernels.kv_quant` for why). A
block's bytes are what :func:`bytes_per_block` says, scales included, so a memory budget divided by
it gives the pool size: the same budget holds proportionally more quantised blocks.

Swap and copy-on-write move a block's scales with its values (:meth:`KVPool.copy_blocks`).
"""

from __future__ import annotations

import torch

from servelab.kernels.kv_quant import SCALE_BYTES, SCALE_DTYPE, bytes_view


def bytes_per_block(num_layers: int, block_size: int, kv_heads: int, head_dim: int, storage_dtype: torch.dtype,
                    quantized: bool) -> int:
    """K and V of one block over all layers, scales included."""
    per_head = head_dim * torch.tensor([], dtype=storage_dtype).element_size() + (SCALE_BYTES if quantized else 0)
    return 2 * num_layers * block_size * kv_heads * per_head


class KVPool:
    """``data[L, 2, N, block_size, kv_heads, head_dim]`` (+ ``scales[L, 2, N, block_size, kv_heads]``)."""

    def __init__(self, num_layers: int, num_blocks: int, block_size: int, kv_heads: int, head_dim: int,
                 storage_dtype: torch.dtype, quantized: bool, device: torch.device | str = "cpu", *,
                 host: bool = False, pin: bool = False) -> None:
        # device pools are zeroed (a masked slot must never hold NaN); a host pool is only read after a
        # swap-out wrote all of it, and an untouched empty CPU pool (GiBs by default) costs no memory
        make = torch.empty if host else torch.zeros
        extra = {"pin_memory": pin} if host else {"device": device}
        shape = (num_layers, 2, num_blocks, block_size, kv_heads)
        self.data = make(shape + (head_dim,), dtype=storage_dtype, **extra)
        self.scales = make(shape, dtype=SCALE_DTYPE, **extra) if quantized else None
        self.num_blocks = num_blocks

    def layers(self) -> list[tuple[torch.Tensor, ...]]:
        """Per layer ``(k_cache, v_cache)``, or ``(k_cache, v_cache, k_scale, v_scale)`` when quantised."""
        if self.scales is None:
            return [(self.data[i, 0], self.data[i, 1]) for i in range(self.data.shape[0])]
        return [(self.data[i, 0], self.data[i, 1], self.scales[i, 0], self.scales[i, 1])
                for i in range(self.data.shape[0])]

    def copy_blocks(self, src_pool: "KVPool", pairs, non_blocking: bool = False) -> None:
        """Copy block ``src`` of ``src_pool`` into block ``dst`` of this pool for each ``(src, dst)``."""
        dst_data, src_data = bytes_view(self.data), bytes_view(src_pool.data)
        for src, dst in pairs:
            dst_data[:, :, dst].copy_(src_data[:, :, src], non_blocking=non_blocking)
            if self.scales is not None:
                assert src_pool.scales is not None, "copying between a quantised pool and a plain one"
                self.scales[:, :, dst].copy_(src_pool.scales[:, :, src], non_blocking=non_blocking)
