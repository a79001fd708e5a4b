"""Fast-forward in the simulator's cluster (``sim.fast_forward``, docs/cluster.md "Fast-forward"):
an arrival ends only the span of the replica it is routed to (the others' spans pause at it and
go on), the router sees exactly what it sees step by step, and a run interrupted while spans are
paused writes what the step-by-step run writes."""

from __future__ import annotations

import json

import pytest

from servelab.api import compose
from servelab.assemble.block_size import workload_requests
from servelab.assemble.executor import model_shape
from servelab.assemble.stack import run_arrivals
from servelab.cluster.build import build_cluster
from servelab.plugins.routers.least_outstanding import LeastOutstandingRouter
from servelab.run.session import run_job

BASE = ("backend=sim", "hardware=h100", "model=llama3_8b", "max_model_len=2048")
ROUTE = LeastOutstandingRouter.route
BUSY = ("cluster.replicas=4", "workload.num_requests=80", "workload.rate=40")  # arrivals land mid-span


def cfg_of(*overrides: str):
    return compose([*BASE, *overrides], logger="none", progress=False)


def test_an_arrival_ends_only_the_span_of_its_replica():
    cfg = cfg_of(*BUSY, "scheduler=fcfs")  # fcfs: only an arrival changes its decisions
    requests = workload_requests(cfg, model_shape(cfg))
    cluster, stacks = build_cluster(cfg, requests)
    for r in cluster.replicas:
        r.engine.keep_steps = False  # nobody reads per-step records: spans may run
    cluster.run(run_arrivals(cfg, requests))
    for r in cluster.replicas:
        engine = r.engine
        scheduled = engine.totals.num_steps - engine.num_fast_forwarded
        assert engine.num_fast_forwarded > 0
        # one scheduled step per request placed here (its prompt fits one step); arrivals elsewhere cost none
        assert scheduled <= r.placed, (r.index, scheduled, r.placed)
    # the replica an arrival reaches takes its span's decodes in bulk beside it (fcfs declares it)
    assert sum(r.engine.num_bulk_arrival_steps for r in cluster.replicas) > 0
    for stack in stacks:
        stack.executor.shutdown()


def _views_and_records(monkeypatch, tmp_path, fast_forward: bool, stop_at: int | None = None):
    """Every routing decision's views, and requests.jsonl, of a least_outstanding cluster run
    (interrupted at the ``stop_at``-th decision)."""
    seen = []

    def route(self, request, views, now):
        seen.append((request.id, now, list(views)))
        if len(seen) == stop_at:
            raise KeyboardInterrupt
        return ROUTE(self, request, views, now)

    monkeypatch.setattr(LeastOutstandingRouter, "route", route)
    out = tmp_path / str(fast_forward)
    cfg = cfg_of(*BUSY, "router=least_outstanding", "router.by=tokens", "num_kv_blocks=400",
                 f"sim.fast_forward={str(fast_forward).lower()}")
    if stop_at is None:
        run_job(cfg, out)
    else:
        with pytest.raises(KeyboardInterrupt):
            run_job(cfg, out)
    lines = sorted((out / "requests.jsonl").read_text().splitlines())
    summary = json.loads((out / "summary.json").read_text())
    summary.pop("wall_s", None)
    return seen, lines, summary


def test_the_router_sees_what_it_sees_step_by_step(monkeypatch, tmp_path):
    """Gauges included (waiting, running, KV use): a replica whose span passed the decision's time
    shows them as of the step under way then, as stepping does."""
    stepped = _views_and_records(monkeypatch, tmp_path, False)
    forwarded = _views_and_records(monkeypatch, tmp_path, True)
    assert len(forwarded[0]) == 80
    assert forwarded[0] == stepped[0]
    assert forwarded[1] == stepped[1]


def test_a_run_interrupted_while_spans_are_paused_writes_what_stepping_writes(monkeypatch, tmp_path):
    stepped = _views_and_records(monkeypatch, tmp_path, False, stop_at=50)
    forwarded = _views_and_records(monkeypatch, tmp_path, True, stop_at=50)
    assert forwarded[2]["status"] == "interrupted" and forwarded[2]["num_unfinished"] > 0
    assert forwarded[1] == stepped[1]  # the unfinished requests' tokens so far too
    assert forwarded[2] == stepped[2]
