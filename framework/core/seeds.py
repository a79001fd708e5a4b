"""Per-token sampling seeds: a function of the request and the position only, never of batching."""

from __future__ import annotations

import zlib


def sample_seed(run_seed: int, request_seed: int | None, seq_id: str, position: int) -> int:
    """The seed of the token at ``position`` of request ``seq_id``.

    A request with its own seed draws the same tokens whatever its id (OpenAI's ``seed``: the same
    request with the same seed gives the same output, and a server names each request anew); one
    without draws from the run's seed and its id."""
    if request_seed is not None:
        return (request_seed * 1_000_003 + position) % (2**63 - 1)
    return (run_seed * 1_000_003 + zlib.crc32(seq_id.encode()) * 7919 + position) % (2**63 - 1)
