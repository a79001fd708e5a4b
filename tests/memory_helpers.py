"""Shared helpers for the memory-policy tests: build a stack on the KV-checking fake executor
(or the tiny real model) and run a list of requests to completion."""

from __future__ import annotations

from functools import lru_cache

from hypothesis import strategies as st

from conftest import pin_test_defaults
from servelab.api import compose
from servelab.core.request import Request
from servelab.run.runner import run_workload
from servelab.run.session import RunResult, collect_results
from servelab.assemble.stack import Stack, build_stack
from servelab.kit.testing import KVCheckingExecutor, VirtualClock

VOCAB = 1000


@st.composite
def workloads(draw, max_tokens: int = 12, classes: bool = False):
    """1-8 requests whose prompts often start with one of a few shared prefixes; with ``classes``
    they also get priorities and TTFT targets (what priority / SLO schedulers order by)."""
    bases = draw(st.lists(st.lists(st.integers(0, VOCAB - 1), min_size=1, max_size=40), min_size=1, max_size=3))
    requests = []
    for i in range(draw(st.integers(1, 8))):
        base = draw(st.sampled_from(bases))
        prefix = base[:draw(st.integers(0, len(base)))]
        tail = draw(st.lists(st.integers(0, VOCAB - 1), min_size=0 if prefix else 1, max_size=30))
        extra = ({"priority": draw(st.integers(0, 2)), "ttft_slo_ms": draw(st.sampled_from([None, 50.0]))}
                 if classes else {})
        requests.append(Request(f"r{i}", tuple(prefix + tail), draw(st.integers(1, max_tokens)),
                                arrival_time=draw(st.sampled_from([0.0, 0.0, 0.01, 0.03])), **extra))
    return requests


@lru_cache(maxsize=256)
def _cfg(overrides: tuple[str, ...]):
    return compose(pin_test_defaults(overrides), logger="none", progress=False)


def fake_stack(overrides: list[str], num_blocks: int, num_swap_blocks: int = 0) -> Stack:
    """A stack on :class:`KVCheckingExecutor` with ``num_blocks`` device blocks."""
    cfg = _cfg(tuple(overrides) + (f"num_kv_blocks={num_blocks}",))
    clock = VirtualClock()
    executor = KVCheckingExecutor(clock, num_blocks, cfg.block_size, vocab_size=VOCAB,
                                  num_swap_blocks=num_swap_blocks, max_positions=cfg.max_model_len)
    stack = build_stack(cfg, executor=executor, clock=clock)
    stack.clock = clock
    return stack


def run_requests(stack: Stack, requests: list[Request], max_steps: int = 20_000) -> RunResult:
    """Run ``requests`` to the end (virtual time on the fake executor, wall time otherwise);
    fail instead of hanging if the engine loops (e.g. swapping the same sequence back and forth)."""
    clock = getattr(stack, "clock", None)
    kwargs = {"sleep": clock.sleep} if clock is not None else {}

    def cap(record):
        if record.step >= max_steps:
            raise AssertionError(f"no end after {max_steps} steps: livelock? queues {record.queues}")

    stack.engine.step_listeners.append(cap)
    run_workload(stack.engine, requests, **kwargs)
    return collect_results(stack.engine, 1.0)


def tokens_by_id(result: RunResult) -> dict[str, list[int]]:
    return {r["id"]: r["output_token_ids"] for r in result.requests}
