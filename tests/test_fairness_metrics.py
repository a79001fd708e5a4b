"""The fairness figures (docs/metrics.md#fairness-between-clients): hand-built runs with known answers,
Jain's index over time, and the figures of a whole run (summary.json, requests.jsonl, the report)."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from conftest import compose
from servelab.core.errors import ConfigError
from servelab.core.request import Request
from servelab.kit.testing import FakeExecutor, VirtualClock
from servelab.results.fairness import ServiceLog, config_weights, fairness_figures, fairness_over_time, jain_index
from servelab.run.session import run_job
from servelab.assemble.stack import build_stack

FIGURES = ("service_by_client", "max_service_gap_tokens", "jain_fairness_index")


def _log(*requests) -> ServiceLog:
    """``(client, arrival, end, prompt_len, token_times)`` per request."""
    log = ServiceLog()
    for client, arrival, end, prompt, times in requests:
        log.add(client, arrival, end, prompt, np.asarray(times, dtype=float))
    return log


def test_two_clients_served_in_lockstep_are_perfectly_fair():
    # both backlogged over (0, 10]; each gets one token per step, in the same steps
    figures = fairness_figures(_log(("a", 0, 10, 0, range(1, 11)), ("b", 0, 10, 0, range(1, 11))))
    assert figures == {"service_by_client": {"a": 20.0, "b": 20.0}, "max_service_gap_tokens": 0.0,
                       "jain_fairness_index": 1.0}


def test_alternating_steps_leave_a_gap_of_one_token():
    # a on odd steps, b on even ones: the service difference never exceeds one output token (weight 2)
    figures = fairness_figures(_log(("a", 0, 20, 0, range(1, 20, 2)), ("b", 0, 20, 0, range(2, 21, 2))))
    assert figures["max_service_gap_tokens"] == 2.0
    assert figures["jain_fairness_index"] == pytest.approx(1.0)


def test_one_client_served_entirely_first():
    # both arrive at 0; a gets all 10 tokens and its prompt (30 tokens) before b gets anything
    figures = fairness_figures(_log(("a", 0, 10, 30, range(1, 11)), ("b", 0, 20, 5, range(11, 21))),
                               input_weight=1.0, output_weight=2.0)
    assert figures["service_by_client"] == {"a": 30 + 20.0, "b": 5 + 20.0}
    assert figures["max_service_gap_tokens"] == 50.0  # all of a's service, while b waited
    assert figures["jain_fairness_index"] == 0.5  # b's service came when a had left: not contended


def test_weights_scale_the_service():
    figures = fairness_figures(_log(("a", 0, 10, 30, range(1, 11)), ("b", 0, 20, 5, range(11, 21))),
                               input_weight=0.5, output_weight=3.0)
    assert figures["service_by_client"] == {"a": 15 + 30.0, "b": 2.5 + 30.0}
    assert figures["max_service_gap_tokens"] == 45.0


def test_the_gap_is_max_minus_min_within_a_period():
    # a leads by 6 early, then b catches up and leads by 4: the worst sub-interval differs by 10
    a_times = [1, 2, 3]  # +6 by t=3
    b_times = [4, 5, 6, 7, 8]  # -10 over (3, 8]
    figures = fairness_figures(_log(("a", 0, 20, 0, a_times), ("b", 0, 20, 0, b_times)))
    assert figures["max_service_gap_tokens"] == 10.0


def test_the_gap_counts_only_while_both_are_backlogged():
    # a alone over (0, 5] gets 5 tokens; b arrives at 5; then they alternate: the lone service is no gap
    a = ("a", 0, 15, 0, [1, 2, 3, 4, 5, 6, 8, 10, 12, 14])
    b = ("b", 5, 15, 0, [7, 9, 11, 13, 15])
    figures = fairness_figures(_log(a, b))
    assert figures["max_service_gap_tokens"] == 2.0
    assert figures["jain_fairness_index"] == pytest.approx(1.0)  # 5 tokens each while both waited
    assert figures["service_by_client"] == {"a": 20.0, "b": 10.0}


def test_fewer_than_two_clients_have_no_figures():
    assert fairness_figures(_log(("a", 0, 10, 3, [1, 2]), ("a", 1, 10, 3, [3]))) == dict.fromkeys(FIGURES)
    assert fairness_figures(_log((None, 0, 10, 3, [1, 2]), (None, 1, 10, 3, [3]))) == dict.fromkeys(FIGURES)
    assert fairness_figures(ServiceLog()) == dict.fromkeys(FIGURES)


def test_requests_without_a_client_are_the_anonymous_client_beside_named_ones():
    figures = fairness_figures(_log((None, 0, 10, 0, range(1, 11)), ("a", 0, 10, 0, range(1, 11))))
    assert figures["service_by_client"] == {"": 20.0, "a": 20.0} and figures["jain_fairness_index"] == 1.0


def test_clients_never_backlogged_together():
    figures = fairness_figures(_log(("a", 0, 5, 0, [1, 2, 3]), ("b", 6, 9, 0, [7, 8])))
    assert figures["max_service_gap_tokens"] == 0.0 and figures["jain_fairness_index"] is None
    assert figures["service_by_client"] == {"a": 6.0, "b": 4.0}


def test_an_unfinished_request_stays_backlogged():
    # b never got a token and never ended: a's service all came while b waited
    figures = fairness_figures(_log(("a", 0, 4, 0, [1, 2, 3, 4]), ("b", 0, None, 0, [])))
    assert figures["max_service_gap_tokens"] == 8.0 and figures["jain_fairness_index"] == 0.5


def test_jain_index():
    assert jain_index([3, 3, 3]) == 1.0 and jain_index([5, 0]) == 0.5 and jain_index([1, 0, 0, 0]) == 0.25
    assert jain_index([4]) is None and jain_index([0, 0]) is None


def test_fairness_over_time_per_window():
    # (0, 10]: both backlogged, a served first; (10, 20]: both, lockstep; (20, 30]: a alone
    a = ("a", 0, 30, 0, list(range(1, 11)) + list(range(11, 21)) + list(range(21, 31)))
    b = ("b", 0, 20, 0, list(range(11, 21)))
    series = fairness_over_time(_log(a, b), window_s=10.0)
    assert series.window_start_s.tolist() == [0.0, 10.0, 20.0]
    assert series.clients == ["a", "b"]
    # windows are (start, start + 10]: a's tokens 1..10 fall in the first
    assert series.service.tolist() == [[20.0, 20.0, 0.0], [0.0, 20.0, 0.0]]
    assert series.jain[:2].tolist() == [0.5, 1.0]
    assert np.isnan(series.jain[2])  # a alone: nothing to compare


def test_fairness_over_time_from_requests_jsonl_records():
    records = [  # both clients queued over (0, 10]: only a's running request is served in it;
        # token times rebuilt from ttft_ms and itl_ms, admission from queue_ms
        {"id": "a-run", "client_id": "a", "arrival_s": 0.0, "prompt_len": 0, "queue_ms": 0.0, "ttft_ms": 1000.0,
         "itl_ms": [1000.0] * 8, "finish_reason": "length", "rejected_reason": None},
        {"id": "a-wait", "client_id": "a", "arrival_s": 0.0, "prompt_len": 0, "queue_ms": 10000.0,
         "ttft_ms": 10000.0, "itl_ms": [1000.0] * 9, "finish_reason": "length", "rejected_reason": None},
        {"id": "b", "client_id": "b", "arrival_s": 0.0, "prompt_len": 0, "queue_ms": 20000.0, "ttft_ms": 20000.0,
         "itl_ms": [1000.0] * 9, "finish_reason": "length", "rejected_reason": None},
        {"id": "r", "client_id": "c", "arrival_s": 0.0, "prompt_len": 9, "ttft_ms": None, "itl_ms": [],
         "finish_reason": None, "rejected_reason": "too long"},
    ]
    series = fairness_over_time(records, window_s=5.0)
    assert series.clients == ["a", "b"]  # a rejected request is nobody's service
    assert series.jain[0] == pytest.approx(0.5) and np.isnan(series.jain[-1])
    assert fairness_figures(ServiceLog.of(records))["max_service_gap_tokens"] == 20.0
    with pytest.raises(ValueError, match="window_s"):
        fairness_over_time(records, 0)


def test_thousands_of_requests_take_well_under_a_second():
    rng = np.random.default_rng(0)
    log = ServiceLog()
    for i in range(4000):
        arrival = rng.uniform(0, 200)
        times = arrival + np.cumsum(rng.uniform(0.01, 0.1, rng.integers(1, 30)))
        log.add(f"c{i % 4}", arrival, times[-1], 100, times)
    assert len(log.times) > 50_000
    start = time.perf_counter()
    figures = fairness_figures(log)
    fairness_over_time(log, 1.0)
    assert time.perf_counter() - start < 1.0
    assert 0.9 < figures["jain_fairness_index"] <= 1.0 and figures["max_service_gap_tokens"] > 0


def test_a_thousand_clients_cost_their_overlaps_not_every_pair():
    # a server where every request has its own user: ~10 backlogged at once, not 500,000 pairs
    rng = np.random.default_rng(1)
    log = ServiceLog()
    for i, arrival in enumerate(np.cumsum(rng.exponential(0.5, 1000))):
        times = arrival + 1 + np.cumsum(rng.uniform(0.02, 0.05, rng.integers(5, 60)))
        log.add(f"user-{i}", arrival, times[-1], 100, times)
    start = time.perf_counter()
    figures = fairness_figures(log)
    assert time.perf_counter() - start < 1.0
    assert len(figures["service_by_client"]) == 1000 and figures["max_service_gap_tokens"] > 0


def test_config_weights_are_checked():
    assert config_weights(compose()) == (1.0, 2.0)
    assert config_weights(compose("fairness.input_weight=0.5", "fairness.output_weight=4")) == (0.5, 4.0)
    with pytest.raises(ConfigError, match=r"^fairness\.output_weight=0 must be > 0$"):
        config_weights(compose("fairness.output_weight=0"))
    with pytest.raises(ConfigError, match=r"^fairness\.input_weight=-1 must be > 0$"):
        config_weights(compose("fairness.input_weight=-1"))


def _run(tmp_path, requests=None, *overrides):
    cfg = compose(*overrides, "num_kv_blocks=64", "block_size=4")
    clock = VirtualClock()
    stack = build_stack(cfg, executor=FakeExecutor(clock, 64), clock=clock)
    return run_job(cfg, tmp_path, requests, stack)


def test_a_run_with_clients_writes_the_figures_and_client_ids(tmp_path, capsys):
    requests = [Request(f"r{i}", tuple(range(1, 6)), 4, client_id="ab"[i % 2]) for i in range(6)]
    # two seats: the clients' requests queue side by side and are served alike
    result = _run(tmp_path, requests, "fairness.input_weight=1", "fairness.output_weight=3", "max_num_seqs=2")
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["service_by_client"] == {"a": 3 * (5 + 3 * 4), "b": 3 * (5 + 3 * 4)}
    assert summary["jain_fairness_index"] == pytest.approx(1.0)
    assert summary["max_service_gap_tokens"] >= 0
    records = [json.loads(line) for line in (tmp_path / "requests.jsonl").read_text().splitlines()]
    assert sorted(r["client_id"] for r in records) == ["a", "a", "a", "b", "b", "b"]
    assert result.summary == summary
    from servelab.results.report import print_summary

    print_summary(summary, str(tmp_path))
    out = capsys.readouterr().out
    assert "jain_fairness_index" in out and "service_by_client.a" in out


def test_a_run_without_clients_has_null_figures_and_null_client_ids(tmp_path, capsys):
    requests = [Request(f"r{i}", tuple(range(1, 6)), 4) for i in range(3)]
    summary = _run(tmp_path, requests).summary
    assert all(summary[k] is None for k in FIGURES)
    records = [json.loads(line) for line in (tmp_path / "requests.jsonl").read_text().splitlines()]
    assert [r["client_id"] for r in records] == [None, None, None]
    from servelab.results.report import print_summary

    print_summary(summary, str(tmp_path))
    assert "jain_fairness_index" not in capsys.readouterr().out


def test_workload_clients_reach_the_summary(tmp_path):
    summary = _run(tmp_path, None, "workload.num_requests=16", "workload.prompt_len.max=32",
                   "workload.output_len.max=16", "workload.clients=[{id:a,rate:2},{id:b,rate:20}]",
                   "max_num_seqs=1").summary  # one seat: requests queue
    assert set(summary["service_by_client"]) == {"a", "b"}
    assert summary["max_service_gap_tokens"] > 0 and 0 < summary["jain_fairness_index"] <= 1
    records = [json.loads(line) for line in (tmp_path / "requests.jsonl").read_text().splitlines()]
    for client, service in summary["service_by_client"].items():
        mine = [r for r in records if r["client_id"] == client]
        assert service == sum(r["prompt_len"] + 2 * r["output_len"] for r in mine)
    # requests.jsonl alone rebuilds token times from ttft_ms and itl_ms (microseconds): tokens of one step
    # may then fall a microsecond apart, so the gap can differ by about a token; the summary has exact times
    rebuilt = fairness_figures(ServiceLog.of(records))
    assert rebuilt["service_by_client"] == summary["service_by_client"]
    assert rebuilt["max_service_gap_tokens"] == pytest.approx(summary["max_service_gap_tokens"], abs=2 * 2.0)
    assert rebuilt["jain_fairness_index"] == pytest.approx(summary["jain_fairness_index"], abs=0.02)


def test_bad_fairness_weights_stop_the_run_before_it_starts(tmp_path):
    with pytest.raises(ConfigError, match="fairness.input_weight"):
        _run(tmp_path, [Request("r", (1, 2), 2)], "fairness.input_weight=0")


def _reference(requests, input_weight=1.0, output_weight=2.0):
    """The definitions of docs/metrics.md, walked point by point (slow, obviously right)."""
    def backlogged(c, t):
        return any(cc == c and s < t <= (float("inf") if e is None else e) for cc, s, e, _, _ in requests)

    events = []
    for c, _, _, prompt, times in requests:
        events += [(t, c, output_weight + (input_weight * prompt if n == 0 else 0.0)) for n, t in enumerate(times)]
    clients = sorted({r[0] for r in requests})
    points = sorted({p for c, s, e, _, times in requests for p in (s, e, *times) if p is not None} | {1e9})
    mids = [(p, (p + q) / 2) for p, q in zip(points, points[1:])]
    gap = 0.0
    for x, i in enumerate(clients):
        for j in clients[x + 1:]:
            d = top = bottom = 0.0
            inside = False
            for (p, mid), q in zip(mids, points[1:]):
                if not (backlogged(i, mid) and backlogged(j, mid)):
                    inside = False
                    continue
                if not inside:
                    d = top = bottom = 0.0
                    inside = True
                d += sum(w * ((c == i) - (c == j)) for t, c, w in events if t == q)
                top, bottom = max(top, d), min(bottom, d)
                gap = max(gap, top - bottom)
    share = {c: sum(w for t, cc, w in events if cc == c and backlogged(c, t)
                    and any(backlogged(o, t) for o in clients if o != c)) for c in clients}
    contenders = [c for c in clients if any(backlogged(c, mid) and any(backlogged(o, mid) for o in clients if o != c)
                                           for _, mid in mids)]
    return gap, jain_index([share[c] for c in contenders]) if len(contenders) >= 2 else None


@pytest.mark.parametrize("seed", range(12))
def test_the_vectorised_figures_match_the_definitions(seed):
    rng = np.random.default_rng(seed)
    requests = []
    for _ in range(rng.integers(3, 12)):  # integer times: ties between clients and boundaries are common
        client = f"c{rng.integers(0, 3)}"
        arrival = int(rng.integers(0, 30))
        times = arrival + np.cumsum(rng.integers(1, 4, size=rng.integers(0, 6)))
        end = None if rng.random() < 0.15 else int(times[-1]) if times.size else arrival + int(rng.integers(0, 3))
        requests.append((client, arrival, end, int(rng.integers(0, 9)), [float(t) for t in times]))
    figures = fairness_figures(_log(*requests), 1.0, 2.0)
    if len({r[0] for r in requests}) < 2:
        assert figures == dict.fromkeys(FIGURES)
        return
    gap, jain = _reference(requests)
    assert figures["max_service_gap_tokens"] == gap
    assert figures["jain_fairness_index"] == (pytest.approx(jain) if jain is not None else None)
