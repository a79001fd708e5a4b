"""Closed-loop arrivals (``workload.arrival=closed_loop``, issue 35 item 1): N clients, each sending
its next request when its previous one ends, on the simulator and the real model."""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import compose
from servelab.core.errors import ConfigError
from servelab.core.request import Request, Sequence
from servelab.run.session import run_job
from servelab.workloads.arrivals import ClosedLoop

SIM = ("backend=sim", "model=llama3_8b", "hardware=h100")


def _records(folder) -> list[dict]:
    return [json.loads(line) for line in (folder / "requests.jsonl").read_text().splitlines()]


def _max_in_flight(records: list[dict]) -> int:
    """The most requests between arrival and end at once (an end before an arrival at the same time)."""
    events = sorted([(r["arrival_s"], 1) for r in records] + [(r["arrival_s"] + r["e2e_ms"] / 1e3, -1) for r in records])
    return int(np.max(np.cumsum([d for _, d in events])))


def _sim_closed_loop(tmp_path, name, *overrides):
    cfg = compose(*SIM, "workload.num_requests=30", "workload.arrival=closed_loop", *overrides)
    result = run_job(cfg, tmp_path / name)
    return result.summary, _records(tmp_path / name)


def test_n_clients_never_have_more_than_n_requests_in_flight(tmp_path):
    summary, records = _sim_closed_loop(tmp_path, "c3", "workload.concurrency=3")
    assert summary["status"] == "completed" and summary["num_finished"] == 30
    assert summary["concurrency"] == 3
    assert _max_in_flight(records) == 3
    assert sum(r["arrival_s"] == 0.0 for r in records) == 3  # the first N at t=0, the rest when one ended
    ends = sorted(r["arrival_s"] + r["e2e_ms"] / 1e3 for r in records)
    later = sorted(r["arrival_s"] for r in records if r["arrival_s"] > 0)
    assert np.allclose(later, ends[:len(later)])  # each later send is an earlier request's end (no think time)


@pytest.mark.parametrize("cluster", [("cluster.replicas=2",), ("cluster.prefill_replicas=1", "cluster.decode_replicas=1")],
                         ids=["two_replicas", "prefill_decode"])
def test_a_cluster_runs_closed_loop_through_its_router(tmp_path, cluster):
    summary, records = _sim_closed_loop(tmp_path, "cluster", "workload.concurrency=4", *cluster)
    assert summary["status"] == "completed" and summary["num_finished"] == 30
    assert summary["concurrency"] == 4
    assert _max_in_flight(records) == 4
    ends = sorted(r["arrival_s"] + r["e2e_ms"] / 1e3 for r in records)
    later = sorted(r["arrival_s"] for r in records if r["arrival_s"] > 0)
    assert np.allclose(later, ends[:len(later)])  # each later send is an earlier request's end, on either replica
    if "cluster.replicas=2" in cluster:
        assert all(replica["num_requests"] > 0 for replica in summary["per_replica"])


def test_think_time_separates_a_clients_end_from_its_next_send(tmp_path):
    think = 0.25
    _, records = _sim_closed_loop(tmp_path, "think", "workload.concurrency=2", f"workload.think_time_s={think}")
    ends = sorted(r["arrival_s"] + r["e2e_ms"] / 1e3 for r in records)
    later = sorted(r["arrival_s"] for r in records if r["arrival_s"] > 0)
    assert np.allclose(later, np.array(ends[:len(later)]) + think)


def test_exponential_think_times_are_seeded_draws():
    def sends(seed):
        loop = ClosedLoop([Request(f"r{i}", (1, 2), 1) for i in range(4)], 1, 1.0, "exponential", seed)
        times = []
        while (due := loop.pop_due(float("inf"))) is not None:
            request, at = due
            times.append(at)
            seq = Sequence(request, arrival_s=at)
            seq.finish("length", at + 1.0)
            loop.on_end(seq)
        return times

    assert sends(0) == sends(0) and sends(0) != sends(1)
    gaps = np.diff(sends(0)) - 1.0  # minus the request's own second
    assert len(gaps) == 3 and (gaps > 0).all() and len(set(gaps)) == 3


@pytest.mark.parametrize("think", [("workload.think_time_s=0",), ("workload.think_time_s=0.05",),
                                   ("workload.think_time_s=0.05", "workload.think_time_dist=exponential")])
def test_fast_forward_on_and_off_give_identical_closed_loop_results(tmp_path, think):
    on, records_on = _sim_closed_loop(tmp_path, "on", "workload.concurrency=4", *think, "sim.fast_forward=true")
    off, records_off = _sim_closed_loop(tmp_path, "off", "workload.concurrency=4", *think, "sim.fast_forward=false")
    assert records_on == records_off
    assert on == off


def test_fast_forward_stops_after_a_step_in_which_a_request_ended(tmp_path):
    """Without ``stop_after_end`` the span would run past the end that makes the next arrival known."""
    from servelab.engine.engine import Engine

    spans = []
    original = Engine.fast_forward

    def spy(self, *args, **kwargs):
        ended = self.num_ended
        steps = original(self, *args, **kwargs)
        if steps:
            spans.append((steps, self.num_ended - ended, kwargs.get("stop_after_end")))
        return steps

    Engine.fast_forward = spy  # type: ignore[method-assign]
    try:
        _sim_closed_loop(tmp_path, "spy", "workload.concurrency=4", "sim.fast_forward=true")
    finally:
        Engine.fast_forward = original  # type: ignore[method-assign]
    assert spans, "no span ran: the test proves nothing"
    assert all(stop for _, _, stop in spans)
    assert any(ended for _, ended, _ in spans)


def test_open_loop_summaries_say_concurrency_null(tmp_path):
    cfg = compose(*SIM, "workload.num_requests=4")
    assert run_job(cfg, tmp_path).summary["concurrency"] is None


def test_tiny_code_runs_closed_loop_on_the_wall_clock(tmp_path):
    cfg = compose("model=tiny_code", "workload=synthetic", "workload.num_requests=5", "workload.arrival=closed_loop",
                  "workload.concurrency=2", "workload.prompt_len.min=4", "workload.prompt_len.max=12",
                  "workload.output_len.min=2", "workload.output_len.max=6")
    summary = run_job(cfg, tmp_path).summary
    records = _records(tmp_path)
    assert summary["status"] == "completed" and summary["num_finished"] == 5 and summary["concurrency"] == 2
    assert sum(r["arrival_s"] == 0.0 for r in records) == 2
    assert _max_in_flight(records) <= 2
    assert all(r["ttft_ms"] >= 0 for r in records)


@pytest.mark.parametrize("overrides, message", [
    (("workload.arrival=closed_loop", "workload.concurrency=0"), "workload.concurrency=0 must be >= 1"),
    (("workload.arrival=closed_loop",), "workload.arrival=closed_loop needs workload.concurrency=N"),
    (("workload.concurrency=4",), "workload.concurrency=4 applies only to workload.arrival=closed_loop"),
    (("workload.arrival=closed_loop", "workload.concurrency=2", "workload.think_time_s=-1"),
     "workload.think_time_s=-1.0 must be >= 0"),
    (("workload.arrival=closed_loop", "workload.concurrency=2", "workload.time_scale=2"),
     "workload.time_scale=2.0: closed-loop arrivals"),
])
def test_bad_closed_loop_settings_are_one_line(tmp_path, overrides, message):
    cfg = compose(*SIM, "workload.num_requests=4", *overrides)
    with pytest.raises(ConfigError) as err:
        run_job(cfg, tmp_path)
    assert str(err.value).startswith(message) and "\n" not in str(err.value)
    assert not (tmp_path / "summary.json").exists()


def test_llm_generate_sends_closed_loop_requests_as_clients_free_up():
    from servelab.api import LLM

    llm = LLM([*SIM, "workload.arrival=closed_loop", "workload.concurrency=2"], logger="none", progress=False)
    requests = [Request(f"r{i}", tuple(range(1, 40)), 20, arrival_time=5.0) for i in range(5)]  # times ignored
    records = llm.generate(requests).requests
    assert sorted(r["arrival_s"] for r in records)[:2] == [0.0, 0.0]
    assert _max_in_flight(records) == 2
