"""Prefix-cache block identity is a collision-resistant digest, and cache_salt separates tenants
(issue 15)."""

from __future__ import annotations

import json

import pytest

from servelab.core import block_hash
from servelab.plugins.allocators import paged
from servelab.plugins.allocators.paged import block_digest
from servelab.core.request import Request
from servelab.workloads.build import WorkloadError, build_requests

from conftest import compose
from memory_helpers import fake_stack, run_requests, tokens_by_id

PREFIX = ["allocator.prefix_caching=true", "block_size=4", "max_model_len=128"]


def test_digest_covers_parent_and_every_token():
    root = block_digest(b"", [1, 2, 3, 4])
    assert len(root) == 16 and root == block_digest(b"", (1, 2, 3, 4))
    assert root != block_digest(b"", [1, 2, 3, 5]) and root != block_digest(b"x", [1, 2, 3, 4])
    assert block_digest(b"", [2**40]) != block_digest(b"", [0])  # no truncation of large ids


def test_identity_does_not_rest_on_python_hash(monkeypatch):
    """Were blocks keyed by hash(), a hash() where everything collides would serve one request
    another's KV (the KV-checking executor would see it); with digests nothing changes."""
    requests = [Request(f"r{i}", tuple(range(10 * i, 10 * i + 13)), 5, arrival_time=0.1 * i) for i in range(4)]
    expected = tokens_by_id(run_requests(fake_stack(PREFIX, 64), requests))
    monkeypatch.setattr(paged, "hash", lambda _: 0, raising=False)  # shadows the builtin in paged.py
    monkeypatch.setattr(block_hash, "hash", lambda _: 0, raising=False)  # and where the digests are made
    result = run_requests(fake_stack(PREFIX, 64), requests)
    assert tokens_by_id(result) == expected
    assert all(r["num_cached_prompt_tokens"] == 0 for r in result.requests)  # nothing is shared
    # ... and the check has teeth: an identity where everything collides is caught
    monkeypatch.setattr(block_hash, "block_digest", lambda parent, tokens: b"\0" * 16)
    with pytest.raises(AssertionError, match="KV slot"):
        run_requests(fake_stack(PREFIX, 64), requests)


def _cached(salts):
    prompt = tuple(range(100, 117))  # 4 full blocks of 4 + 1
    requests = [Request(f"r{i}", prompt, 2, arrival_time=0.1 * i, cache_salt=s) for i, s in enumerate(salts)]
    stack = fake_stack(PREFIX, 64)
    result = run_requests(stack, requests)
    assert result.summary["leaked_blocks"] == 0
    return [r["num_cached_prompt_tokens"] for r in sorted(result.requests, key=lambda r: r["id"])]


def test_equal_salts_share_and_different_salts_never_do():
    assert _cached([None, None]) == [0, 16]
    assert _cached(["tenant-a", "tenant-a"]) == [0, 16]
    assert _cached(["tenant-a", "tenant-b", None, "tenant-b"]) == [0, 0, 0, 16]


def test_jsonl_cache_salt(tmp_path):
    path = tmp_path / "w.jsonl"
    path.write_text(json.dumps({"prompt_len": 4, "max_tokens": 2, "cache_salt": "acme"}) + "\n"
                    + json.dumps({"prompt_len": 4, "max_tokens": 2}) + "\n")
    cfg = compose("workload=jsonl", f"workload.path={path}").workload
    assert [r.cache_salt for r in build_requests(cfg, 100, 64)] == ["acme", None]
    path.write_text(json.dumps({"prompt_len": 4, "max_tokens": 2, "cache_salt": 7}) + "\n")
    with pytest.raises(WorkloadError, match=r"w.jsonl:1: 'cache_salt' must be a string"):
        build_requests(cfg, 100, 64)
