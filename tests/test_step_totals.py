"""Step records are summed in one place (StepTotals): a run's totals, a cluster's merge of its
replicas' totals, and the logger's window all go through it."""

from __future__ import annotations

import random

import pytest

from servelab.core.interfaces import PreemptionDecision
from servelab.engine.engine import StepRecord
from servelab.engine.step_totals import StepTotals


def _records(n: int, seed: int, start: float = 0.0) -> list[StepRecord]:
    rng = random.Random(seed)
    out, t = [], start
    for i in range(n):
        d = rng.uniform(0.001, 0.02)
        t += d
        kinds = rng.sample(["recompute", "swap"], rng.randint(0, 2))
        drafts = rng.choice([0, 0, 4])
        out.append(StepRecord(step=i, time_s=t, duration_s=d, model_s=d * 0.8, num_seqs=rng.randint(1, 9),
                              num_tokens=rng.randint(1, 300), prefill_tokens=rng.randint(0, 200),
                              decode_seqs=rng.randint(0, 8), kv_utilization=rng.random(), queues={},
                              comm_s=d * 0.1, preempted=[PreemptionDecision(f"r{i}{k}", k) for k in kinds],
                              extra={"kv_waste_fraction": rng.random(), "sometimes": rng.choice([None, 1.0])},
                              swap_out_blocks=rng.randint(0, 3), swap_in_blocks=rng.randint(0, 3),
                              draft_tokens=drafts, accepted_tokens=rng.randint(0, drafts)))
    return out


def _totals(records) -> StepTotals:
    totals = StepTotals()
    for r in records:
        totals.add(r)
    return totals


def test_merging_replicas_adds_what_adds_and_keeps_the_largest_maxima():
    a, b = _records(40, 1), _records(25, 2, start=0.1)
    ta, tb = _totals(a), _totals(b)
    merged, together = StepTotals.merged([ta, tb]), _totals(a + b)
    for name in ("num_steps", "recomputed_tokens", "prefill_tokens", "swap_out_blocks", "swap_in_blocks",
                 "num_seqs", "num_tokens", "decode_seqs", "draft_tokens", "accepted_tokens", "preemptions",
                 "gauge_counts", "kv_utilization_max"):
        assert getattr(merged, name) == getattr(together, name), name
    for name in ("kv_utilization_sum", "model_s", "comm_s", "busy_s", "kv_utilization_mean"):
        assert getattr(merged, name) == pytest.approx(getattr(together, name)), name
    assert merged.gauge_sums == pytest.approx(together.gauge_sums)
    assert merged.gauge_mean("kv_waste_fraction") == pytest.approx(together.gauge_mean("kv_waste_fraction"))
    # replicas run side by side: the last step is the later one, the peaks add up (an upper bound)
    assert merged.last_time_s == max(ta.last_time_s, tb.last_time_s)
    assert merged.max_concurrent == ta.max_concurrent + tb.max_concurrent
    assert merged.num_preemptions == sum(len(r.preempted) for r in a + b)
    assert StepTotals.merged([]) == StepTotals()


def test_the_logger_window_reads_its_figures_from_step_totals():
    from servelab.results.loggers import StepWindow

    records, sent = _records(30, 3), []
    window = StepWindow(lambda data, step: sent.append(data), every=len(records), min_interval_s=0.0)
    for r in records:
        window.log_step(r)
    (point,) = sent
    totals, n = _totals(records), len(records)
    assert point["step/window_steps"] == n
    assert point["step/num_seqs"] == pytest.approx(totals.num_seqs / n)
    assert point["step/duration_ms"] == pytest.approx(totals.busy_s / n * 1e3)
    assert point["step/kv_utilization"] == pytest.approx(totals.kv_utilization_mean)
    assert point["step/kv_utilization_max"] == totals.kv_utilization_max
    assert point["step/num_preempted"] == totals.num_preemptions
    assert point["step/draft_tokens"] == totals.draft_tokens
    span = records[-1].time_s - (records[0].time_s - records[0].duration_s)
    assert point["tokens_per_s"] == pytest.approx(totals.num_tokens / span)
