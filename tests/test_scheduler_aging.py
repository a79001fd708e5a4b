"""Time-dependent waiting orders (``QueueScheduler.time_dependent_key``) and ``priority``'s aging:
plain priority starves a low-priority request under a steady urgent stream; aging bounds its wait."""

from __future__ import annotations

import pytest

from test_schedulers import fake_engine, first_step_of, req, run
from servelab.core.errors import ConfigError

AGING_S = 0.05


def starving_workload():
    """One priority-1 request, then priority-0 requests every 10 ms — more than one seat serves."""
    return [req("low", 8, 3, priority=1)] + [req(f"u{i}", 8, 4, arrival=0.01 * i, priority=0) for i in range(40)]


def test_plain_priority_starves_the_low_priority_request():
    engine, clock = fake_engine("priority", "max_num_seqs=1")
    out = run(engine, clock, starving_workload())
    assert all(first_step_of(engine, "low") > first_step_of(engine, f"u{i}") for i in range(40))
    assert out["low"]["output_len"] == 3


def test_aging_admits_it_before_everyone_who_arrived_aging_s_later():
    engine, clock = fake_engine("priority", "max_num_seqs=1", f"scheduler.aging_s={AGING_S}")
    out = run(engine, clock, starving_workload())
    low = first_step_of(engine, "low")
    later = [f"u{i}" for i in range(40) if 0.01 * i >= AGING_S]
    assert all(low < first_step_of(engine, r) for r in later)
    assert any(low > first_step_of(engine, f"u{i}") for i in range(40))  # it did wait: priority still counts
    assert out["low"]["output_len"] == 3 and all(out[f"u{i}"]["output_len"] == 4 for i in range(40))


def test_aging_keeps_outputs_and_frees_every_block():
    engines = [fake_engine("priority", "max_num_seqs=2", *extra, num_kv_blocks=12)
               for extra in ((), (f"scheduler.aging_s={AGING_S}",))]
    outs = [run(engine, clock, starving_workload()) for engine, clock in engines]
    assert {k: v["output_token_ids"] for k, v in outs[0].items()} == {k: v["output_token_ids"] for k, v in outs[1].items()}


def test_aging_s_must_be_positive():
    with pytest.raises(ConfigError, match=r"scheduler.aging_s=0.0 must be > 0"):
        fake_engine("priority", "scheduler.aging_s=0")
