"""Stack fuzz: random stacks (every scheduler x allocator x preemption x prefix caching x chunked
prefill x block size) x random workloads (lengths, arrivals, priorities, SLOs, shared prefixes,
cache salts, invalid requests mixed in) x small pools, on the KV-checking fake executor
(``fuzz_stacks.py``). Every case: each valid request finishes with the default stack's tokens
(or is rejected because it can never fit the pool), each invalid one is rejected with a reason,
no block leaks, and the run ends within ``MAX_STEPS`` steps (a livelock fails, it cannot hang).

CI runs 100 seeded cases (``SERVELAB_FUZZ_CASES=N`` for another number); the 1,000-case job is

    SERVELAB_FUZZ_LONG=1 bash scripts/dev.sh test tests/test_fuzz.py -m slow

A failure names its seed: ``run_case(make_case(seed))`` replays it exactly.
"""

from __future__ import annotations

import logging
import os

import pytest

from fuzz_stacks import make_case, run_case

BATCH = 50
CI_CASES = int(os.environ.get("SERVELAB_FUZZ_CASES", 100))
LONG_CASES, LONG_FIRST_SEED = 1000, 1_000_000  # seeds apart from CI's


def _run_seeds(seeds) -> list[str]:
    failures = []
    logging.disable(logging.WARNING)  # zero-pool swap warnings, fallbacks: expected here
    try:
        for seed in seeds:
            try:
                run_case(make_case(seed))
            except Exception as exc:  # noqa: BLE001 - every failing seed is reported, not just the first
                failures.append(f"seed {seed}: {type(exc).__name__}: {exc}")
    finally:
        logging.disable(logging.NOTSET)
    return failures


@pytest.mark.parametrize("batch", range(-(-CI_CASES // BATCH)))
def test_fuzz(batch):
    failures = _run_seeds(range(batch * BATCH, min(CI_CASES, (batch + 1) * BATCH)))
    assert not failures, "\n".join(failures)


@pytest.mark.slow
@pytest.mark.skipif(not os.environ.get("SERVELAB_FUZZ_LONG"),
                    reason="1,000 cases (minutes): SERVELAB_FUZZ_LONG=1 pytest tests/test_fuzz.py -m slow")
def test_fuzz_long():
    failures = _run_seeds(range(LONG_FIRST_SEED, LONG_FIRST_SEED + LONG_CASES))
    assert not failures, f"{len(failures)} of {LONG_CASES} cases failed:\n" + "\n".join(failures)


def test_the_fuzz_catches_a_broken_policy(monkeypatch):
    """The checks have teeth: an allocator that forgets to free leaks, and the case fails."""
    from servelab.plugins.allocators.paged import PagedAllocator

    monkeypatch.setattr(PagedAllocator, "free", lambda self, seq: None)
    seed = next(s for s in range(100) if "allocator=paged" in make_case(s).overrides)
    with pytest.raises(AssertionError, match=f"seed={seed}"):
        run_case(make_case(seed))
