"""Seeded random scenarios for the conformance kit and the project's stack fuzz: a random stack x
a random workload (valid and invalid requests mixed, shared prefixes, priorities, SLOs, cache
salts) x a small pool, to run on the KV-checking fake executor.

``make_scenario(seed)`` is a pure function of the seed (and of the plugin put under test), so a
failing scenario is replayed exactly from what :meth:`Scenario.describe` prints.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field, replace
from typing import Any

from servelab.core.request import Request

VOCAB = 1000
SCHEDULERS = ("fcfs", "static", "priority", "slo_aware")
ALLOCATORS = ("paged", "contiguous", "contiguous_max_model_len")
PREEMPTIONS = ("recompute", "swap", "adaptive")
BLOCK_SIZES = (1, 2, 4, 8, 16)
INVALID = ("empty prompt", "max_tokens < 1", "token outside the vocabulary", "prompt too long")


@dataclass
class Scenario:
    """One run: config overrides, the pool, and the requests (``invalid``: id -> why it must be rejected)."""

    seed: int
    overrides: tuple[str, ...]
    max_model_len: int
    num_blocks: int
    num_swap_blocks: int
    requests: list[Request]
    invalid: dict[str, str] = field(default_factory=dict)

    def describe(self) -> str:
        return f"seed={self.seed} pool={self.num_blocks} swap={self.num_swap_blocks} {' '.join(self.overrides)}"

    def without(self, request_id: str) -> "Scenario":
        """The same scenario less one request (for shrinking a failure)."""
        return replace(self, requests=[r for r in self.requests if r.id != request_id],
                       invalid={k: v for k, v in self.invalid.items() if k != request_id})

    def reproducer(self) -> str:
        """The scenario as text a test can paste: overrides, pool, and each request."""
        lines = [f"  overrides: {' '.join(self.overrides)}",
                 f"  pool: num_blocks={self.num_blocks} num_swap_blocks={self.num_swap_blocks} "
                 f"(KVCheckingExecutor, vocab_size={VOCAB})",
                 f"  requests ({len(self.requests)}):"]
        for r in self.requests:
            extra = "".join(f", {k}={getattr(r, k)!r}" for k in ("priority", "ttft_slo_ms", "tpot_slo_ms", "cache_salt", "client_id")
                            if getattr(r, k) not in (None, 0))
            why = f"  # invalid: {self.invalid[r.id]}" if r.id in self.invalid else ""
            lines.append(f"    Request({r.id!r}, {tuple(r.prompt_token_ids)!r}, {r.max_tokens}, "
                         f"arrival_time={r.arrival_time!r}{extra}),{why}")
        return "\n".join(lines)


def make_scenario(seed: int, kind: str | None = None, name: str | None = None) -> Scenario:
    """A random scenario; with ``kind``/``name`` that plugin replaces the random choice of its kind
    (the random stream is the same, so other choices do not move). An evictor is put behind the
    paged allocator with prefix caching on (the only place it is asked anything)."""
    rng = random.Random(seed)
    max_model_len = rng.choice((64, 128))
    drawn_allocator = rng.choice(ALLOCATORS[:1] * 2 + ALLOCATORS)  # paged half the time: it is the one that preempts
    given: dict[str | None, str | None] = {"allocator": name, "evictor": "paged"}
    allocator = given.get(kind, drawn_allocator)
    assert allocator is not None  # kind=allocator comes with its name
    block_size = rng.choice(BLOCK_SIZES)
    chunked = rng.random() < 0.6
    choice: dict[str, str | None] = {"scheduler": rng.choice(SCHEDULERS), "allocator": allocator,
                                     "preemption": rng.choice(PREEMPTIONS)}
    if kind in choice:
        choice[kind] = name
    overrides = [f"scheduler={choice['scheduler']}", f"allocator={allocator}",
                 f"preemption={choice['preemption']}", f"block_size={block_size}",
                 f"chunked_prefill={str(chunked).lower()}", f"max_model_len={max_model_len}",
                 f"max_num_seqs={rng.choice((2, 4, 8, 8))}",
                 f"max_num_batched_tokens={rng.choice((16, 32, max_model_len)) if chunked else max_model_len}"]
    prefix_caching = (drawn_allocator == "paged" and rng.random() < 0.5) or kind == "evictor"
    if allocator == "paged":
        overrides.append(f"allocator.prefix_caching={str(prefix_caching).lower()}")
    if rng.random() < 0.3:
        overrides.append(f"slo.ttft_ms={rng.choice((50, 200, 1000))}")
    if kind in ("drafter", "evictor"):
        overrides.append(f"{kind}={name}")
    requests, invalid = _workload(rng, max_model_len)
    requests = _with_clients(seed, requests)
    valid = [r for r in requests if r.id not in invalid]
    reserve = {"contiguous_max_model_len": lambda r: max_model_len}.get(  # what the allocator holds per request
        allocator, lambda r: min(r.prompt_len + r.max_tokens, max_model_len))
    blocks = [-(-reserve(r) // block_size) for r in valid] or [1]
    if rng.random() < 0.7:  # room for the largest request, tight for all: preemption
        num_blocks = max(max(blocks) + rng.randint(0, 2), int(rng.uniform(0.2, 0.7) * sum(blocks)))
    else:  # from below the largest request (some rejected for the pool) to a fraction of them all
        num_blocks = max(1, int(rng.uniform(0.5, 1.3) * max(max(blocks), sum(blocks) // 3)))
    return Scenario(seed, tuple(overrides), max_model_len, num_blocks, rng.choice((0, 2, 8, 64)), requests, invalid)


def _with_clients(seed: int, requests: list[Request]) -> list[Request]:
    """Half the scenarios spread their requests over two or three clients (fair-sharing
    schedulers); from a separate stream, so the rest of the scenario is the same with or without."""
    rng = random.Random(f"clients-{seed}")
    if rng.random() < 0.5:
        return requests
    clients = ("a", "b", "c")[:rng.randint(2, 3)]
    return [replace(r, client_id=rng.choice(clients)) for r in requests]


def _workload(rng: random.Random, max_model_len: int) -> tuple[list[Request], dict[str, str]]:
    bases = [[rng.randrange(VOCAB) for _ in range(rng.randint(1, 40))] for _ in range(rng.randint(1, 3))]
    arrival, requests, invalid = 0.0, [], {}
    for i in range(rng.randint(2, 12)):
        base = rng.choice(bases)
        prompt = base[:rng.randint(0, len(base))] + [rng.randrange(VOCAB) for _ in range(rng.randint(0, 30))]
        prompt = prompt[:max_model_len - 1] or [rng.randrange(VOCAB)]
        max_tokens = rng.randint(1, 16)
        if rng.random() < 0.3:  # else together with the previous one
            arrival += rng.choice((0.005, 0.02, 0.1))
        bad = rng.choice(INVALID) if rng.random() < 0.15 else None
        if bad == "empty prompt":
            prompt = []
        elif bad == "max_tokens < 1":
            max_tokens = rng.choice((0, -1, -7))
        elif bad == "token outside the vocabulary":
            prompt[rng.randrange(len(prompt))] = rng.choice((VOCAB, VOCAB + 5, -1))
        elif bad == "prompt too long":
            prompt = [rng.randrange(VOCAB) for _ in range(max_model_len + rng.randint(0, 8))]
        rid = f"r{i}"
        if bad:
            invalid[rid] = bad
        slo: dict[str, Any] = {}
        if rng.random() < 0.3:
            slo = {"ttft_slo_ms": rng.choice((20.0, 100.0, 1e4)), "tpot_slo_ms": rng.choice((None, 5.0, 50.0))}
        requests.append(Request(rid, tuple(prompt), max_tokens, arrival_time=arrival, priority=rng.randint(0, 3),
                                cache_salt=rng.choice((None, None, None, "a", "b")), **slo))
    return requests, invalid
