"""A sequence's block identity, computed once and kept on it (vLLM's ``Request.block_hashes``).

Each *full* block of a sequence's tokens is identified by a chained digest, :func:`block_digest`
(BLAKE2b-128 of the parent block's digest and the block's token ids), so identity never rests on
Python's 64-bit ``hash()``, where two different prefixes can collide and a request would read
another's KV. A request's ``cache_salt`` seeds the chain (:func:`root_digest`): requests with
different salts (tenants) never share a block. :func:`block_hashes` extends
``Sequence.block_hashes`` to every full block of the sequence's tokens, hashing each block once in
the sequence's life; the allocator, the evictors, the KV tiers and the conformance kit read them
there. Tokens only ever append to a sequence, so a digest once computed stays valid.

No torch and no imports above ``core``.
"""

from __future__ import annotations

import hashlib
from array import array
from typing import TYPE_CHECKING, Iterable

if TYPE_CHECKING:
    from servelab.core.request import Sequence


def block_digest(parent: bytes, tokens: Iterable[int]) -> bytes:
    """The identity of a full block: BLAKE2b-128 over the parent's digest and the token ids
    (8 bytes each). Collision-resistant, unlike ``hash()``: equal digests mean equal prefixes."""
    return hashlib.blake2b(parent + array("q", tokens).tobytes(), digest_size=16).digest()


def root_digest(seq: "Sequence") -> bytes:
    """The chain's start: empty, or a digest of the request's ``cache_salt`` (its tenant)."""
    salt = seq.request.cache_salt
    return b"" if salt is None else hashlib.blake2b(b"salt\0" + salt.encode(), digest_size=16).digest()


def block_hashes(seq: "Sequence", block_size: int) -> list[bytes]:
    """``seq.block_hashes``, first extended to every full block of its tokens (each hashed once).
    The list is the sequence's own: read it, never change it. One block size per sequence (its
    engine's); a sequence moved to an engine of another block size is a new sequence."""
    hashes = seq.block_hashes
    tokens = seq.token_ids
    full = len(tokens) // block_size
    if len(hashes) < full:
        parent = hashes[-1] if hashes else root_digest(seq)
        for j in range(len(hashes), full):
            parent = block_digest(parent, tokens[j * block_size:(j + 1) * block_size])
            hashes.append(parent)
    return hashes
