"""Seeded random cases for the stack fuzz (tests/test_fuzz.py): a random stack x a random
workload (valid and invalid requests mixed) x a small pool, run on the KV-checking fake executor
and checked against the default stack. The cases come from the conformance kit's generator, which
runs one plugin through the same scenarios (``servelab check-plugin``).

``make_case(seed)`` is a pure function of the seed, so a failing case is rerun exactly with
``run_case(make_case(seed))``. ``run_case`` raises ``AssertionError`` naming the seed, the stack
and the broken rule.
"""

from __future__ import annotations

from functools import lru_cache

from conftest import pin_test_defaults
from servelab.api import compose
from servelab.kit.conformance_cases import VOCAB, Scenario, make_scenario
from servelab.core.request import Request
from servelab.run.runner import run_workload
from servelab.run.session import collect_results
from servelab.assemble.stack import build_stack
from servelab.kit.testing import KVCheckingExecutor, VirtualClock

MAX_STEPS = 5_000  # per case: far above what any case needs; reaching it is a livelock
Case = Scenario  # the generator is the conformance kit's (servelab.kit.conformance_cases)


def make_case(seed: int) -> Case:
    return make_scenario(seed)


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
