"""Per-token sampling seeds: a function of the request and the position only, never of batching."""

from __future__ import annotations

import zlib


def sample_seed(run_seed: int, request_seed: int | None, seq_id: str, position: int) -> int:
    """The seed of the token at ``position`` of request ``seq_id`` (its own seed, else the run's)."""
    base = request_seed if request_seed is not None else run_seed
    return (base * 1_000_003 + zlib.crc32(seq_id.encode()) * 7919 + position) % (2**63 - 1)
