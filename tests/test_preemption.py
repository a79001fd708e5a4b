"""Preemption policies on the fake executor: victim rules, swap fallbacks with stated reasons,
adaptive decisions with both estimates, and the swap/recompute metrics."""

from __future__ import annotations

import logging

import pytest

from servelab.core.request import Request, Sequence
from servelab.plugins.preemption.victims import VictimRule, select_victim

from memory_helpers import fake_stack, run_requests, tokens_by_id


def _requests(n=6, prompt=24, out=16):
    return [Request(f"r{i}", tuple(range(i * 50, i * 50 + prompt)), out) for i in range(n)]


def _decisions(result):
    return [p for s in result.steps for p in s.preempted]


class _Tables:
    def __init__(self, sizes):
        self.sizes = sizes

    def block_table(self, seq_id):
        return list(range(self.sizes[seq_id]))


def test_victim_rules():
    seqs = [Sequence(Request(f"s{i}", (1, 2), 8, priority=p)) for i, p in enumerate([0, 5, 5, 1])]
    for s, n in zip(seqs, [3, 0, 1, 2]):
        for _ in range(n):
            s.append_token(1, 0.0)
    tables = _Tables({"s0": 4, "s1": 9, "s2": 1, "s3": 9})
    assert select_victim(VictimRule.last, seqs, tables) is seqs[3]
    assert select_victim("lowest_priority", seqs, tables) is seqs[2]  # tie on priority 5 -> the later one
    assert select_victim("most_blocks", seqs, tables) is seqs[3]
    assert select_victim("least_progress", seqs, tables) is seqs[1]


@pytest.mark.parametrize("rule", [r.value for r in VictimRule])
def test_every_victim_rule_keeps_tokens(rule):
    requests = [Request(f"r{i}", tuple(range(i * 50, i * 50 + 24)), 16, priority=i % 3) for i in range(6)]
    expected = tokens_by_id(run_requests(fake_stack(["block_size=4"], 256), requests))
    result = run_requests(fake_stack(["block_size=4", "preemption=swap", f"preemption.victim={rule}"], 24, 64),
                          requests)
    assert tokens_by_id(result) == expected and result.summary["num_preemptions"] > 0


def test_swap_counts_bytes_both_ways():
    result = run_requests(fake_stack(["block_size=4", "preemption=swap"], 24, 64), _requests())
    kinds = result.summary["num_preemptions_by_kind"]
    assert set(kinds) == {"swap"}
    moved = sum(s.swap_out_blocks for s in result.steps)
    assert result.summary["swap_out_bytes"] == result.summary["swap_in_bytes"] == moved * 4096 > 0
    assert result.summary["recomputed_tokens"] == 0


def test_swap_falls_back_to_recompute_when_the_pool_is_too_small(caplog):
    caplog.set_level(logging.INFO)
    result = run_requests(fake_stack(["block_size=4", "preemption=swap"], 24, 2), _requests())
    decisions = _decisions(result)
    assert decisions and all(d.kind == "recompute" for d in decisions)
    assert all("whole host swap pool has 2" in d.reason for d in decisions)
    assert "whole host swap pool has 2" in caplog.text
    assert result.summary["recomputed_tokens"] == sum(d.num_computed_tokens for d in decisions) > 0


def test_swap_without_a_pool_warns_at_start(caplog):
    fake_stack(["preemption=swap"], 24, 0)
    assert "host swap pool of 0 blocks" in caplog.text


@pytest.mark.parametrize("bandwidth, kind", [(1e12, "swap"), (1e2, "recompute")])
def test_adaptive_picks_the_cheaper_and_records_both_estimates(bandwidth, kind):
    stack = fake_stack(["block_size=4", "preemption=adaptive"], 24, 64)
    stack.engine.cost_model.swap_bytes_per_s = bandwidth
    result = run_requests(stack, _requests())
    decisions = _decisions(result)
    assert decisions and {d.kind for d in decisions} == {kind}
    for d in decisions:
        assert d.estimates["swap_s"] >= 0 and d.estimates["recompute_s"] >= 0
        assert (d.estimates["swap_s"] < d.estimates["recompute_s"]) == (kind == "swap")


def test_configured_bandwidth_replaces_the_measurement():
    stack = fake_stack(["preemption=adaptive", "backend.swap_bandwidth_gb_s=2.5"], 24, 64)
    assert stack.engine.cost_model.swap_bytes_per_s == 2.5e9
    measured = fake_stack(["preemption=adaptive"], 24, 64)
    assert measured.engine.cost_model.swap_bytes_per_s == measured.executor.swap_bytes_per_s


def test_cost_model_coefficients_stay_non_negative_on_noisy_steps():
    import numpy as np

    from servelab.core.cost_model import StepCostModel, StepFeatures

    model, rng = StepCostModel(), np.random.default_rng(0)
    for _ in range(100):  # the time depends on prefill tokens only, plus noise as large as the signal
        p = int(rng.integers(0, 200))
        model.observe(StepFeatures(p, int(rng.integers(0, 30)), p * p // 2), 1e-5 * p + abs(rng.normal(0, 2e-3)))
    assert all(v >= 0 for v in model.coefficients.values())
    assert model.recompute_seconds(100) > 0
