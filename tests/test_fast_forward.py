"""``sim.fast_forward``: the simulator's results are identical with it on and off
(:mod:`servelab.engine.fast_forward`), for every built-in stack, the experiments' simulator
presets, random stacks, clusters; and the kit names a plugin whose declared quiet steps were wrong."""

from __future__ import annotations

import random
import sys
import tempfile

import pytest

from servelab.api import compose
from servelab.core.registry import default_registry
from servelab.kit.conformance_fast_forward import run_both_ways
from servelab.plugin_api import EVERY_STEP, UNTIL_ARRIVAL, NextDecision, QueueScheduler, hookimpl
from servelab.plugins.schedulers.fcfs import FCFSScheduler
from servelab.run.session import run_job
from servelab.assemble.stack import build_stack
from servelab.testing import check_plugin, registry_with
from servelab.workloads.build import build_requests

BASE = ("backend=sim", "hardware=h100", "model=llama3_8b", "max_model_len=2048")
LOAD = ("workload.num_requests=60", "workload.rate=10")
TIGHT = ("workload.num_requests=60", "workload.rate=60", "num_kv_blocks=90")  # preemption
CHAT = ("workload=chat_sessions", "workload.num_sessions=16", "workload.session_rate=8", "workload.think_time_s=1",
        "allocator.prefix_caching=true", "num_kv_blocks=200")  # shared prefixes, a small cache: evictions

#: every built-in scheduler, allocator, preemption policy and evictor, each in a run where it acts
BUILTIN_STACKS = {
    "fcfs": ("scheduler=fcfs", *LOAD),
    "fcfs-tight": ("scheduler=fcfs", *TIGHT),
    "priority": ("scheduler=priority", *TIGHT),
    "priority-aging": ("scheduler=priority", "scheduler.aging_s=0.2", *TIGHT),
    "sjf": ("scheduler=sjf", "length_predictor=noisy_oracle", "scheduler.preemptive=true", *TIGHT),
    "mlfq-swap": ("scheduler=mlfq", "preemption=swap", "backend.num_swap_blocks=300", *TIGHT),
    "vtc": ("scheduler=vtc", *CHAT),
    "lpm": ("scheduler=lpm", *CHAT),
    "slo_aware": ("scheduler=slo_aware", *LOAD),
    "slo_aware-targets": ("scheduler=slo_aware", "slo.ttft_ms=300", "slo.tpot_ms=15", *TIGHT),
    "static": ("scheduler=static", "max_num_seqs=8", *LOAD),
    "contiguous": ("allocator=contiguous", "num_kv_blocks=1500", *LOAD),
    "adaptive": ("preemption=adaptive", "backend.num_swap_blocks=100", *TIGHT),
    "lfu": ("evictor=lfu", *CHAT),
    "arc": ("evictor=arc", *CHAT),
    "cost_aware": ("evictor=cost_aware", *CHAT),
    "chunked-off": ("chunked_prefill=false", "max_num_batched_tokens=2048", *LOAD),  # prefill_first
    "chunked-off-tight": ("chunked_prefill=false", "max_num_batched_tokens=2048", *TIGHT),
    "chunked-off-static": ("scheduler=static", "max_num_seqs=8", "chunked_prefill=false",
                           "max_num_batched_tokens=2048", *LOAD),
    "chunked-off-decode-first": ("chunked_prefill=false", "non_chunked_schedule=decode_first",
                                 "max_num_batched_tokens=2048", *LOAD),
}


@pytest.mark.parametrize("name", sorted(BUILTIN_STACKS))
def test_builtin_stacks_identical_with_and_without(name):
    difference, forwarded, steps = run_both_ways(BASE + BUILTIN_STACKS[name], default_registry())
    assert difference is None, difference
    if name in ("fcfs", "slo_aware", "contiguous", "chunked-off", "chunked-off-decode-first"):  # a stack that has quiet steps uses them
        assert forwarded > steps // 4, (forwarded, steps)


def test_experiment_presets_identical():
    """The simulator presets, shrunk: continuous_vs_static_sim (its steps log off: it turns the
    fast-forward off) and a capacity-search probe at 70B on 4 x H100 (TP) with a trace."""
    presets = [
        ("experiment=continuous_vs_static_sim", "debug.log_steps=false", "workload.num_requests=120", "scheduler=static"),
        ("experiment=continuous_vs_static_sim", "debug.log_steps=false", "workload.num_requests=120"),
        ("backend=sim", "clock=virtual", "time_model=auto", "hardware=h100", "model=llama3_70b",
         "tensor_parallel_size=4", "workload=trace", "workload.path=azure_conv", "workload.num_requests=150",
         "workload.time_scale=0.5"),
    ]
    for overrides in presets:
        difference, forwarded, _ = run_both_ways(overrides, default_registry())
        assert difference is None, (overrides, difference)
        assert forwarded > 0, overrides


def test_cluster_identical_with_and_without():
    overrides = BASE + ("cluster.replicas=3", "router=least_outstanding", "workload.num_requests=90", "workload.rate=30")
    difference, _, _ = run_both_ways(overrides, default_registry())
    assert difference is None, difference


def test_steps_log_turns_fast_forward_off(tmp_path):
    cfg = compose(list(BASE + LOAD) + ["debug.log_steps=true"], logger="none", progress=False)
    stack = build_stack(cfg)
    run_job(cfg, tmp_path, stack=stack)
    assert stack.engine.num_fast_forwarded == 0  # each step's record carries the scheduler's figures


#: Arrivals while requests decode: the arrival's step takes the span's decodes in bulk (fcfs and slo_aware
#: declare it); with a front end the tokens' stamps are its deliveries; a chunked prompt ends the bulk path.
ARRIVALS = {
    "fcfs": ("scheduler=fcfs", "workload.num_requests=80", "workload.rate=20"),
    "slo_aware": ("scheduler=slo_aware", "workload.num_requests=80", "workload.rate=20"),
    "slo_aware-ttft": ("scheduler=slo_aware", "slo.ttft_ms=200", "workload.num_requests=80", "workload.rate=40"),
    "fcfs-frontend": ("scheduler=fcfs", "frontend=servelab_cpu", "workload.num_requests=80", "workload.rate=20"),
    "fcfs-chunks": ("scheduler=fcfs", "max_num_batched_tokens=128", "workload.num_requests=60", "workload.rate=20"),
    "fcfs-few-seats": ("scheduler=fcfs", "max_num_seqs=4", "workload.num_requests=60", "workload.rate=40"),
    "fcfs-tight": ("scheduler=fcfs", *TIGHT),
    "fcfs-blocks": ("scheduler=fcfs", "block_size=8", "allocator.prefix_caching=true", "workload.num_requests=60",
                    "workload.rate=20"),
    "decode-first": ("chunked_prefill=false", "non_chunked_schedule=decode_first", "max_num_batched_tokens=2048",
                     "workload.num_requests=60", "workload.rate=20"),
}


def bulk_arrival_steps(overrides: tuple[str, ...], registry=None) -> int:
    """Steps of a fast-forward run whose decodes were taken in bulk beside arrivals."""
    cfg = compose([*overrides, "sim.fast_forward=true"], logger="none", progress=False)
    stack = build_stack(cfg, registry)
    with tempfile.TemporaryDirectory() as tmp:
        run_job(cfg, tmp, stack=stack)
    return stack.engine.num_bulk_arrival_steps


@pytest.mark.parametrize("name", sorted(ARRIVALS))
def test_arrival_steps_in_bulk_identical(name):
    overrides = BASE + ARRIVALS[name]
    difference, _, _ = run_both_ways(overrides, default_registry())
    assert difference is None, difference
    assert bulk_arrival_steps(overrides) > 0


class UndeclaredQueueScheduler(QueueScheduler):
    """A third-party queue scheduler that declares a fast-forward horizon, not bulk arrivals."""

    name = "ff_no_bulk"

    def next_decision(self, now: float) -> NextDecision:
        return UNTIL_ARRIVAL


class ReorderingFCFS(FCFSScheduler):
    """A subclass of a declaring scheduler that changes the running phase: it inherits fcfs's
    declaration, which did not see its ``running_order``."""

    name = "ff_reordering"

    def running_order(self, running, now):
        return running


@pytest.mark.parametrize("name", ["ff_no_bulk", "ff_reordering"])
def test_a_scheduler_that_does_not_declare_bulk_arrivals_keeps_the_full_step(name):
    registry = registry_with(sys.modules[__name__])
    cfg = compose([*BASE, *ARRIVALS["fcfs"][1:], f"scheduler={name}", "sim.fast_forward=true"], logger="none",
                  progress=False)
    stack = build_stack(cfg, registry)
    with tempfile.TemporaryDirectory() as tmp:
        run_job(cfg, tmp, stack=stack)
    assert stack.engine.num_fast_forwarded > 0 and stack.engine.num_bulk_arrival_steps == 0


SCHEDULERS = ["fcfs", "priority", "sjf length_predictor=oracle", "mlfq", "vtc", "lpm", "slo_aware", "static",
              "slo_aware slo.tpot_ms=20"]
EXTRAS = [(), ("preemption=swap", "backend.num_swap_blocks=150"), ("allocator=contiguous",), ("max_num_seqs=6",),
          ("allocator.prefix_caching=true", "evictor=lfu"), ("block_size=8",), ("max_num_batched_tokens=256",)]
#: a third of the random stacks run on a colocated cluster: its replicas' spans pause at arrivals routed elsewhere
ROUTERS = ["round_robin", "least_outstanding", "least_outstanding router.by=tokens", "power_of_two", "prefix_affinity",
           "session"]


def random_stack(rng: random.Random) -> tuple[str, ...]:
    """A random built-in stack and workload, sized to finish in about a second."""
    overrides = [f"scheduler={rng.choice(SCHEDULERS)}", *rng.choice(EXTRAS),
                 f"workload.num_requests={rng.randint(5, 60)}", f"workload.rate={rng.choice([2, 10, 40, 200])}",
                 f"workload.prompt_len.max={rng.choice([64, 512, 1500])}",
                 f"workload.output_len.max={rng.choice([16, 128, 400])}", f"seed={rng.randrange(1000)}"]
    if rng.random() < 0.5:
        overrides.append(f"num_kv_blocks={rng.choice([60, 120, 400])}")
    if rng.random() < 1 / 3:
        overrides += [f"cluster.replicas={rng.choice([2, 3, 4])}", f"router={rng.choice(ROUTERS)}"]
    if "allocator=contiguous" in overrides:
        overrides = [o for o in overrides if not o.startswith("num_kv_blocks")] + ["num_kv_blocks=2000"]
    return BASE + tuple(" ".join(overrides).split())


def _property(cases: int, seed: int) -> int:
    """``cases`` random stacks identical with and without fast-forward; returns how many of them
    took arrivals' steps in bulk."""
    rng = random.Random(seed)
    stacks = [random_stack(rng) for _ in range(cases)]
    assert any("cluster.replicas" in o for s in stacks for o in s)  # the draw covers clusters
    bulk = 0
    for overrides in stacks:
        difference, _, _ = run_both_ways(overrides, default_registry())
        assert difference is None, f"{' '.join(overrides)}: {difference}"
        bulk += bulk_arrival_steps(overrides) > 0
    return bulk


def test_random_stacks_identical():
    assert _property(6, seed=1) > 0  # the arrivals' bulk path among them


@pytest.mark.slow
def test_random_stacks_identical_many():
    _property(60, seed=2)


class ThrottlingScheduler(FCFSScheduler):
    """Wrong on purpose: in every other 50 ms window only half the running sequences decode, yet
    it declares that only an arrival changes its decisions."""

    name = "ff_wrong"

    def _schedule_running(self, plan, scheduled, budget):
        if int(self.now * 20) % 2:
            budget = min(budget, max(1, len(self.running) // 2))
        return super()._schedule_running(plan, scheduled, budget)

    def next_decision(self, now: float) -> NextDecision:
        return UNTIL_ARRIVAL


class AskedEveryStep(FCFSScheduler):
    """fcfs keeping the default declaration: correct, never fast-forwarded."""

    name = "ff_default"

    def next_decision(self, now: float) -> NextDecision:
        return EVERY_STEP


@hookimpl
def servelab_register_schedulers():
    return [ThrottlingScheduler, AskedEveryStep, UndeclaredQueueScheduler, ReorderingFCFS]


def test_kit_names_a_wrong_declaration():
    registry = registry_with(sys.modules[__name__])
    report = check_plugin("scheduler", "ff_wrong", registry=registry, cases=2, real_model=False)
    assert not report.ok
    failure = next(f for f in report.failures if f.contract == "fast-forward exact")
    assert "scheduler plugin 'ff_wrong'" in failure.message and "next_decision()" in failure.message


def test_kit_notes_a_scheduler_that_keeps_the_default():
    registry = registry_with(sys.modules[__name__])
    report = check_plugin("scheduler", "ff_default", registry=registry, cases=1, real_model=False)
    assert report.ok, str(report)
    assert any("never fast-forwarded" in n for n in report.notes)


def test_resampled_trace_is_lazy_and_any_size():
    cfg = compose(["backend=sim", "workload=trace", "workload.path=azure_conv", "workload.sample=resample",
                   "workload.num_requests=50000"], logger="none", progress=False)
    requests = build_requests(cfg.workload, 32000, 4096)
    assert len(requests) == 50000 and getattr(requests, "in_arrival_order", False)
    first = [r for _, r in zip(range(200), requests)]
    assert [r.arrival_time for r in first] == sorted(r.arrival_time for r in first)
    assert len({r.max_tokens for r in first}) > 20 and first[0].arrival_time == 0.0
