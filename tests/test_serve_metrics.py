"""The server's Prometheus collectors, fed without a server: step records (preemptions, drafts)
and ended sequences (latencies as requests.jsonl records them; aborted ones only counted)."""

from __future__ import annotations

import pytest

pytest.importorskip("prometheus_client", reason="the serve extra (pip install servelab[serve]) is not installed")

from servelab.engine.engine import StepRecord
from servelab.core.interfaces import PreemptionDecision
from servelab.core.request import Request, Sequence, Status
from servelab.serve.metrics import ServeMetrics


def _value(metrics: ServeMetrics, name: str, **labels) -> float:
    return metrics.registry.get_sample_value(name, {"model_name": "m", **labels})


def _record(**kw) -> StepRecord:
    base = dict(step=0, time_s=0.0, duration_s=0.01, model_s=0.01, num_seqs=1, num_tokens=1, prefill_tokens=0,
                decode_seqs=1, kv_utilization=0.5, queues={})
    return StepRecord(**{**base, **kw})


def _ended(rid: str, times: list[float], status=Status.FINISHED, reason="length", cached=0) -> Sequence:
    seq = Sequence(Request(rid, (1, 2, 3, 4), 8, arrival_time=0.0), arrival_s=0.0)
    seq.first_scheduled_time, seq.num_cached_prompt_tokens = 0.0, cached
    for t in times:
        seq.append_token(5, t)
    seq.finish(reason, times[-1] if times else 0.0)
    assert seq.status is status
    return seq


def test_steps_feed_gauges_preemptions_and_speculation():
    m = ServeMetrics("m")
    m.on_step(_record(preempted=[PreemptionDecision("a", "swap"), PreemptionDecision("b", "recompute")],
                      draft_tokens=8, accepted_tokens=6), {"running": 3, "waiting": 2, "swapped": 1}, 0.25)
    assert _value(m, "vllm:num_preemptions_total") == 2
    assert _value(m, "vllm:spec_decode_num_draft_tokens_total") == 8
    assert _value(m, "vllm:spec_decode_num_accepted_tokens_total") == 6
    assert _value(m, "vllm:spec_decode_draft_acceptance_rate") == 0.75
    assert [_value(m, f"vllm:num_requests_{q}") for q in ("running", "waiting", "swapped")] == [3, 2, 1]
    assert _value(m, "vllm:kv_cache_usage_perc") == _value(m, "vllm:gpu_cache_usage_perc") == 0.25


def test_ended_requests_feed_latencies_and_aborts_only_count():
    m = ServeMetrics("m")
    m.on_end(_ended("a", [0.1, 0.3, 0.4], cached=2))
    m.on_end(_ended("b", [0.2], status=Status.ABORTED, reason="abort"))
    assert _value(m, "vllm:time_to_first_token_seconds_count") == 1
    assert _value(m, "vllm:time_to_first_token_seconds_sum") == pytest.approx(0.1)
    assert _value(m, "vllm:inter_token_latency_seconds_count") == 2
    assert _value(m, "vllm:inter_token_latency_seconds_sum") == pytest.approx(0.3)
    assert _value(m, "vllm:request_time_per_output_token_seconds_sum") == pytest.approx(0.15)
    assert _value(m, "vllm:e2e_request_latency_seconds_sum") == pytest.approx(0.4)
    assert _value(m, "vllm:request_success_total", finished_reason="length") == 1
    assert _value(m, "vllm:request_success_total", finished_reason="abort") == 1
    assert _value(m, "vllm:generation_tokens_total") == 4
    assert _value(m, "vllm:prefix_cache_queries_total") == 8 and _value(m, "vllm:prefix_cache_hits_total") == 2
    assert _value(m, "vllm:gpu_prefix_cache_hit_rate") == 0.25
    assert b"vllm:time_to_first_token_seconds_bucket" in m.render()
