"""Scheduler-step overhead: one ``schedule()`` + allocator step, no model.

    pytest benchmarks/bench_scheduler.py --benchmark-only

(``--benchmark-only`` is needed because the project's pytest ``addopts`` has ``--benchmark-skip``.)
256 running sequences in their decode phase at block size 16, with an empty waiting queue and
with a waiting queue of 1,000 that cannot be admitted (every seat is taken); each round is one
step: schedule, then what the engine's apply does to the scheduler's state (one token per
sequence, a new block every 16 steps). The issue's targets: fcfs <= 0.3 ms with 256 running;
priority and slo_aware within 2x of fcfs with the waiting queue. Compare the rows of one run.
"""

from __future__ import annotations

import random

import pytest

from servelab.api import compose
from servelab.core.request import Request, Sequence, Status
from servelab.assemble.stack import build_stack
from servelab.kit.testing import FakeExecutor, VirtualClock

NUM_RUNNING, NUM_WAITING, BLOCK_SIZE, STEP_S = 256, 1000, 16, 0.01


def make_scheduler(name: str, num_waiting: int):
    cfg = compose([f"scheduler={name}", f"block_size={BLOCK_SIZE}", f"max_num_seqs={NUM_RUNNING}",
                   "max_num_batched_tokens=4096", "slo.ttft_ms=100000", "slo.tpot_ms=10000"], logger="none")
    engine = build_stack(cfg, executor=FakeExecutor(VirtualClock(), num_kv_blocks=200_000)).engine
    scheduler, allocator = engine.scheduler, engine.allocator
    rng = random.Random(0)
    for i in range(NUM_RUNNING):
        prompt = tuple(rng.randrange(1000) for _ in range(rng.randrange(32, 512)))
        seq = Sequence(Request(f"run-{i}", prompt, 100_000, priority=rng.randrange(4)))
        assert allocator.allocate_slots(seq, seq.prompt_len)
        seq.num_computed_tokens = seq.prompt_len
        seq.status = Status.RUNNING
        seq.append_token(1, 0.0)
        scheduler.running.append(seq)
    for i in range(num_waiting):
        prompt = tuple(rng.randrange(1000) for _ in range(rng.randrange(32, 512)))
        scheduler.add(Sequence(Request(f"wait-{i}", prompt, 128, priority=4), arrival_s=rng.random()))
    return scheduler, allocator


def one_step(scheduler, allocator, clock: list[float]):
    now = clock[0] = clock[0] + STEP_S
    plan = scheduler.schedule(now)
    for entry in plan.scheduled:  # the engine's apply, minus the model
        seq = entry.seq
        seq.num_computed_tokens += entry.num_tokens
        allocator.on_tokens_computed(seq)
        seq.append_token(1, now)
    return plan


@pytest.mark.parametrize("num_waiting", [0, NUM_WAITING], ids=["no_waiting", "waiting_1000"])
@pytest.mark.parametrize("name", ["fcfs", "static", "priority", "slo_aware"])
def test_scheduler_step(benchmark, name, num_waiting):
    scheduler, allocator = make_scheduler(name, num_waiting)
    clock = [0.0]
    plan = one_step(scheduler, allocator, clock)
    assert len(plan.scheduled) == NUM_RUNNING and not plan.preempted
    benchmark.extra_info.update(running=NUM_RUNNING, waiting=num_waiting, block_size=BLOCK_SIZE)
    benchmark.pedantic(one_step, args=(scheduler, allocator, clock), rounds=300, warmup_rounds=20)
    assert len(scheduler.waiting) == num_waiting  # nobody was admitted: the step measured is steady


def test_apply_only_baseline(benchmark):
    """The apply part of each round alone, to subtract from the rows above."""
    scheduler, allocator = make_scheduler("fcfs", 0)
    clock = [0.0]
    plan = one_step(scheduler, allocator, clock)

    def apply_only():
        now = clock[0] = clock[0] + STEP_S
        for entry in plan.scheduled:
            seq = entry.seq
            seq.num_computed_tokens += entry.num_tokens
            allocator.on_tokens_computed(seq)
            seq.append_token(1, now)

    benchmark.pedantic(apply_only, rounds=300, warmup_rounds=20)
