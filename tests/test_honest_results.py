"""Results that cannot mislead: SLO figures without targets, rejections, all-rejected runs,
``strict_requests``, the ``slo_aware`` warning (issue 15)."""

from __future__ import annotations

import json
import logging

import pytest

from conftest import compose
from servelab.core.errors import ConfigError
from servelab.results.report import all_rejected_error, print_summary
from servelab.core.request import Request
from servelab.run.session import run_job
from servelab.assemble.stack import build_stack
from servelab.kit.testing import FakeExecutor, VirtualClock


def _run(tmp_path, requests, *overrides, num_kv_blocks=64):
    cfg = compose(*overrides, f"num_kv_blocks={num_kv_blocks}")
    clock = VirtualClock()
    stack = build_stack(cfg, executor=FakeExecutor(clock, num_kv_blocks), clock=clock)
    return run_job(cfg, tmp_path, requests, stack)


def _reqs(n, **kw):
    return [Request(f"r{i}", tuple(range(1, 9)), 4, **kw) for i in range(n)]


def test_no_target_means_no_attainment_and_no_goodput(tmp_path):
    summary = _run(tmp_path, _reqs(3)).summary
    assert summary["num_finished"] == 3 and summary["num_requests_with_slo"] == 0
    for key in ("slo_attainment", "ttft_slo_attainment", "tpot_slo_attainment", "goodput_req_s"):
        assert summary[key] is None, key
    records = [json.loads(x) for x in (tmp_path / "requests.jsonl").read_text().splitlines()]
    assert all(r["met_slo"] is None and r["met_ttft_slo"] is None for r in records)
    assert json.loads((tmp_path / "summary.json").read_text())["slo_attainment"] is None


def test_attainment_covers_only_requests_with_a_target(tmp_path):
    requests = _reqs(2) + [Request("t-ok", (1, 2, 3), 2, ttft_slo_ms=1e6),
                           Request("t-miss", (1, 2, 3), 2, ttft_slo_ms=1e-6)]
    summary = _run(tmp_path, requests).summary
    assert summary["num_requests_with_slo"] == 2
    assert summary["slo_attainment"] == summary["ttft_slo_attainment"] == 0.5
    assert summary["tpot_slo_attainment"] is None  # nobody has a TPOT target
    assert summary["goodput_req_s"] == pytest.approx(1 / summary["duration_s"])


def test_run_wide_target_covers_every_request(tmp_path):
    summary = _run(tmp_path, _reqs(3), "slo.ttft_ms=1e9").summary
    assert summary["num_requests_with_slo"] == 3 and summary["slo_attainment"] == 1.0


def test_rejections_are_grouped_by_kind_with_an_example(tmp_path, capsys):
    requests = [Request("empty", (), 4), Request("neg", (1, 2), -1), Request("neg2", (1, 2), -5),
                Request("vocab", (1, 10**6), 2), Request("ok", (1, 2, 3), 2)]
    summary = _run(tmp_path, requests).summary
    assert summary["num_rejected"] == 4 and summary["num_finished"] == 1 and summary["status"] == "completed"
    kinds = summary["rejections"]
    assert kinds["max_tokens=N < N"] == {"count": 2, "example_id": "neg", "example_reason": "max_tokens=-1 < 1"}
    assert kinds["empty prompt"]["count"] == 1 and list(kinds)[0] == "max_tokens=N < N"  # most frequent first
    assert all_rejected_error(summary) is None
    print_summary(summary, str(tmp_path))
    out = capsys.readouterr().out
    assert "rejected requests: 4" in out and "neg: max_tokens=-1 < 1" in out
    assert f"results: {tmp_path}/requests.jsonl" in out  # on one line, whatever the width


def test_a_run_where_every_request_is_rejected_fails_naming_the_reason(tmp_path):
    requests = [Request(f"r{i}", (1, 10**6), 4) for i in range(3)]  # (a pool too small for all: a start-up error)
    summary = _run(tmp_path, requests).summary
    assert summary["status"] == "failed: every request was rejected"
    error = all_rejected_error(summary)
    assert error.startswith("every request (3) was rejected, e.g. request 'r0': prompt token id outside the vocabulary")


def test_strict_requests_turns_a_rejection_into_a_start_up_error(tmp_path):
    requests = _reqs(2) + [Request("bad", (1, 2), 0)]
    with pytest.raises(ConfigError, match=r"strict_requests=true: request 'bad' would be rejected: max_tokens=0 < 1 "
                                          r"\(1 of 3 requests would be\)"):
        _run(tmp_path, requests, "strict_requests=true")
    assert not (tmp_path / "summary.json").exists()  # nothing ran
    assert _run(tmp_path, _reqs(2), "strict_requests=true").summary["num_finished"] == 2


def test_slo_aware_without_any_target_warns(tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="servelab.assemble.preflight"):
        _run(tmp_path, _reqs(2), "scheduler=slo_aware")
    assert "scheduler=slo_aware but no request has a TTFT or TPOT target" in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="servelab.assemble.preflight"):
        _run(tmp_path, _reqs(2, ttft_slo_ms=100.0), "scheduler=slo_aware")
    assert "no request has" not in caplog.text
