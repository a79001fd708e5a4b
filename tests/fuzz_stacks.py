"""Seeded random cases for the stack fuzz (tests/test_fuzz.py): a random stack x a random
workload (valid and invalid requests mixed) x a small pool, run on the KV-checking fake executor
and checked against the default stack.

``make_case(seed)`` is a pure function of the seed, so a failing case is rerun exactly with
``run_case(make_case(seed))``. ``run_case`` raises ``AssertionError`` naming the seed, the stack
and the broken rule.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from functools import lru_cache

from conftest import pin_test_defaults
from servelab.api import compose
from servelab.request import Request
from servelab.runner import run_workload
from servelab.session import collect_results
from servelab.stack import build_stack
from servelab.testing import KVCheckingExecutor, VirtualClock

VOCAB = 1000
MAX_STEPS = 5_000  # per case: far above what any case needs; reaching it is a livelock
SCHEDULERS = ("fcfs", "static", "priority", "slo_aware")
ALLOCATORS = ("paged", "contiguous", "contiguous_max_model_len")
PREEMPTIONS = ("recompute", "swap", "adaptive")
BLOCK_SIZES = (1, 2, 4, 8, 16)
INVALID = ("empty prompt", "max_tokens < 1", "token outside the vocabulary", "prompt too long")


@dataclass
class Case:
    seed: int
    overrides: tuple[str, ...]
    max_model_len: int
    num_blocks: int
    num_swap_blocks: int
    requests: list[Request]
    invalid: dict[str, str] = field(default_factory=dict)  # request id -> why it must be rejected

    def describe(self) -> str:
        return f"seed={self.seed} pool={self.num_blocks} swap={self.num_swap_blocks} {' '.join(self.overrides)}"


def make_case(seed: int) -> Case:
    rng = random.Random(seed)
    max_model_len = rng.choice((64, 128))
    allocator = rng.choice(ALLOCATORS[:1] * 2 + ALLOCATORS)  # paged half the time: it is the one that preempts
    block_size = rng.choice(BLOCK_SIZES)
    chunked = rng.random() < 0.6
    overrides = [f"scheduler={rng.choice(SCHEDULERS)}", f"allocator={allocator}",
                 f"preemption={rng.choice(PREEMPTIONS)}", f"block_size={block_size}",
                 f"chunked_prefill={str(chunked).lower()}", f"max_model_len={max_model_len}",
                 f"max_num_seqs={rng.choice((2, 4, 8, 8))}",
                 f"max_num_batched_tokens={rng.choice((16, 32, max_model_len)) if chunked else max_model_len}"]
    if allocator == "paged":
        overrides.append(f"allocator.prefix_caching={str(rng.random() < 0.5).lower()}")
    if rng.random() < 0.3:
        overrides.append(f"slo.ttft_ms={rng.choice((50, 200, 1000))}")
    requests, invalid = _workload(rng, max_model_len)
    valid = [r for r in requests if r.id not in invalid]
    reserve = {"contiguous_max_model_len": lambda r: max_model_len}.get(  # what the allocator holds per request
        allocator, lambda r: min(r.prompt_len + r.max_tokens, max_model_len))
    blocks = [-(-reserve(r) // block_size) for r in valid] or [1]
    if rng.random() < 0.7:  # room for the largest request, tight for all: preemption
        num_blocks = max(max(blocks) + rng.randint(0, 2), int(rng.uniform(0.2, 0.7) * sum(blocks)))
    else:  # from below the largest request (some rejected for the pool) to a fraction of them all
        num_blocks = max(1, int(rng.uniform(0.5, 1.3) * max(max(blocks), sum(blocks) // 3)))
    return Case(seed, tuple(overrides), max_model_len, num_blocks, rng.choice((0, 2, 8, 64)), requests, invalid)


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
        kind = rng.choice(INVALID) if rng.random() < 0.15 else None
        if kind == "empty prompt":
            prompt = []
        elif kind == "max_tokens < 1":
            max_tokens = rng.choice((0, -1, -7))
        elif kind == "token outside the vocabulary":
            prompt[rng.randrange(len(prompt))] = rng.choice((VOCAB, VOCAB + 5, -1))
        elif kind == "prompt too long":
            prompt = [rng.randrange(VOCAB) for _ in range(max_model_len + rng.randint(0, 8))]
        rid = f"r{i}"
        if kind:
            invalid[rid] = kind
        slo = {}
        if rng.random() < 0.3:
            slo = {"ttft_slo_ms": rng.choice((20.0, 100.0, 1e4)), "tpot_slo_ms": rng.choice((None, 5.0, 50.0))}
        requests.append(Request(rid, tuple(prompt), max_tokens, arrival_time=arrival, priority=rng.randint(0, 3),
                                cache_salt=rng.choice((None, None, None, "a", "b")), **slo))
    return requests, invalid


@lru_cache(maxsize=4096)
def _cfg(overrides: tuple[str, ...]):
    return compose(pin_test_defaults(overrides), logger="none", progress=False)


def _run(overrides: tuple[str, ...], num_blocks: int, num_swap_blocks: int, requests: list[Request]):
    cfg = _cfg(overrides)
    clock = VirtualClock()
    executor = KVCheckingExecutor(clock, num_blocks, cfg.block_size, vocab_size=VOCAB,
                                  num_swap_blocks=num_swap_blocks, max_positions=cfg.max_model_len)
    stack = build_stack(cfg, executor=executor, clock=clock)

    def cap(record):
        if record.step >= MAX_STEPS:
            raise AssertionError(f"no end after {MAX_STEPS} steps (livelock?): queues {record.queues}")

    stack.engine.keep_steps = False
    stack.engine.step_listeners.append(cap)
    run_workload(stack.engine, requests, sleep=clock.sleep)
    return stack, collect_results(stack.engine, 1.0)


def reference(case: Case) -> dict[str, list[int]]:
    """Outputs of the default stack (fcfs, paged, recompute, whole prompts) with room for everything."""
    overrides = (f"max_model_len={case.max_model_len}", "block_size=16", f"max_num_batched_tokens={case.max_model_len}")
    valid = [r for r in case.requests if r.id not in case.invalid]
    _, result = _run(overrides, 64 * max(1, len(valid)), 0, valid)
    return {r["id"]: r["output_token_ids"] for r in result.requests}


def run_case(case: Case) -> dict:
    """Run one case and check every rule; return its summary."""
    where = case.describe()
    try:
        stack, result = _run(case.overrides, case.num_blocks, case.num_swap_blocks, case.requests)
    except Exception as exc:  # a checker assertion, the step cap, the runner's "no progress", a plugin error
        raise AssertionError(f"{where}: {type(exc).__name__}: {exc}") from exc
    expected = reference(case)
    allocator = stack.engine.allocator
    records = {r["id"]: r for r in result.requests}
    assert set(records) == {r.id for r in case.requests}, where
    for req in case.requests:
        rec = records[req.id]
        reason = rec["rejected_reason"]
        if req.id in case.invalid:
            assert reason, f"{where}: {req.id} ({case.invalid[req.id]}) was not rejected: {rec['finish_reason']}"
        elif reason is not None:
            needed = min(req.prompt_len + req.max_tokens, case.max_model_len)
            assert not allocator.can_ever_fit(needed), f"{where}: valid {req.id} rejected: {reason}"
            assert "pool" in reason, f"{where}: {req.id}: {reason}"
        else:
            assert rec["finish_reason"] == "length", f"{where}: {req.id} did not finish: {rec}"
            assert rec["output_token_ids"] == expected[req.id], f"{where}: {req.id}: outputs differ from the default stack"
    summary = result.summary
    assert summary["num_unfinished"] == 0 and summary["leaked_blocks"] == 0, f"{where}: {summary['leaked_blocks']} leaked"
    if hasattr(allocator, "ref_counts"):
        assert all(r == 0 for r in allocator.ref_counts), f"{where}: ref counts left"
    return summary
