"""What the W&B logger sends is bounded by its stated cadence (docs/results.md), not by the run's length.

No timed asserts: the number of ``log`` calls a fake W&B run receives is counted.
"""

from __future__ import annotations

import math

import pytest

from servelab.api import compose
from servelab.engine.engine import StepRecord
from servelab.results.loggers import RequestSample, StepWindow
from servelab.run.session import run_job


class FakeRun:
    """Just enough of ``wandb.sdk.wandb_run.Run`` for the logger; counts what it is sent."""

    def __init__(self, tmp_path):
        self.logged: list[tuple[dict, int | None]] = []
        self.summary: dict = {}
        self.dir = str(tmp_path / "wandb" / "run" / "files")
        self.url = "https://example.invalid/run"
        self.finished = None

    def log(self, data, step=None):
        self.logged.append((data, step))

    def finish(self, exit_code=0):
        self.finished = exit_code


@pytest.fixture
def fake_wandb(monkeypatch, tmp_path):
    import wandb

    runs = []

    def init(**kwargs):
        runs.append(FakeRun(tmp_path))
        return runs[-1]

    monkeypatch.setattr(wandb, "init", init)
    return runs


def _record(step: int, t: float) -> StepRecord:
    return StepRecord(step=step, time_s=t, duration_s=0.01, model_s=0.008, num_seqs=4, num_tokens=40,
                      prefill_tokens=36, decode_seqs=4, kv_utilization=0.25 + 0.5 * (step % 2), queues={})


@pytest.mark.parametrize("num_steps,every", [(1, 1), (999, 100), (1000, 100), (2501, 7)])
def test_a_window_of_k_steps_is_one_point(num_steps, every):
    sent = []
    window = StepWindow(lambda data, step: sent.append((data, step)), every=every, min_interval_s=0.0,
                        queue_lengths=lambda: {"waiting": 3, "running": 4, "swapped": 0})
    for i in range(num_steps):
        window.log_step(_record(i, 0.01 * (i + 1)))
    window.flush()
    assert len(sent) == math.ceil(num_steps / every)
    data, step = sent[0]
    n = min(every, num_steps)
    assert step == n - 1 and data["step/window_steps"] == n
    assert data["step/num_seqs"] == 4 and data["step/num_tokens"] == 40
    assert data["step/kv_utilization_max"] == (0.75 if n > 1 else 0.25)
    assert data["tokens_per_s"] == pytest.approx(40 / 0.01)  # tokens over the window's engine time
    assert data["queue/waiting"] == 3
    assert sum(d["step/window_steps"] for d, _ in sent) == num_steps  # every step is in one window


def test_a_fast_run_sends_at_most_one_point_per_min_interval():
    """~0.2 ms a step (the simulator): the wall-time floor, not the step count, bounds the points."""
    sent, now = [], [0.0]

    def clock():
        return now[0]

    window = StepWindow(lambda data, step: sent.append(step), every=10, min_interval_s=0.25, clock=clock)
    for i in range(100_000):  # 20 s of wall time
        now[0] += 0.0002
        window.log_step(_record(i, float(i)))
    window.flush()
    assert len(sent) <= 20 / 0.25 + 1
    assert len(sent) >= 20 / 0.25 - 1


def test_the_request_sample_is_even_and_bounded():
    sample = RequestSample(max_rows=300)
    for i in range(10_000):
        sample.add({"id": f"r{i}", "prompt_len": i, "output_len": 1, "ttft_ms": None})
    assert 150 <= len(sample.rows) <= 300
    ids = [int(row[0][1:]) for row in sample.rows]
    assert ids[0] == 0 and len(set(b - a for a, b in zip(ids, ids[1:]))) == 1  # evenly spaced
    table = sample.table()
    assert table.columns[:3] == ["id", "prompt_len", "output_len"] and len(table.data) == len(sample.rows)


@pytest.mark.parametrize("every", [10, 25])
def test_a_run_of_n_steps_sends_at_most_n_over_k_points(fake_wandb, tmp_path, every):
    cfg = compose(["backend=sim", "hardware=h100", "model=llama3_8b", "workload.num_requests=40",
                   "workload.rate=20", f"logger.log_every_steps={every}", "logger.log_min_interval_s=0",
                   "logger.table_max_rows=16"], progress=False)
    result = run_job(cfg, tmp_path)
    run = fake_wandb[0]
    steps = [(d, s) for d, s in run.logged if "requests" not in d]
    tables = [d["requests"] for d, _ in run.logged if "requests" in d]
    n = result.summary["num_steps"]
    assert n > 4 * every
    assert len(steps) <= math.ceil(n / every)  # + the table: at most ceil(N/k) + 1 log calls in all
    assert len(run.logged) <= math.ceil(n / every) + 1
    assert [s for _, s in steps] == sorted(s for _, s in steps)
    assert {"step/num_seqs", "step/kv_utilization", "tokens_per_s", "queue/waiting", "time_s"} <= set(steps[0][0])
    assert len(tables) == 1 and 8 <= len(tables[0].data) <= 16  # an even sample of the 40 requests
    assert run.summary["num_requests"] == 40 and run.finished == 0


def test_the_logger_does_not_make_the_engine_build_per_step_details(fake_wandb, tmp_path, monkeypatch):
    """The W&B logger reads queue lengths once per point: the engine's records stay lean."""
    from servelab.engine import engine as engine_mod

    seen = []
    record = engine_mod.Engine.record

    def spy(self, *args, **kwargs):
        rec = record(self, *args, **kwargs)
        seen.append(bool(rec.queues or rec.scheduled))
        return rec

    monkeypatch.setattr(engine_mod.Engine, "record", spy)
    cfg = compose(["backend=sim", "hardware=h100", "model=llama3_8b", "workload.num_requests=8"], progress=False)
    run_job(cfg, tmp_path)
    assert seen and not any(seen)
    assert fake_wandb[0].logged


def test_a_real_offline_wandb_run_takes_the_points_and_the_table(tmp_path):
    cfg = compose(["backend=sim", "hardware=h100", "model=llama3_8b", "workload.num_requests=12",
                   "logger.log_every_steps=5", "logger.log_min_interval_s=0", "logger.table_max_rows=4"],
                  progress=False)
    run_job(cfg, tmp_path)
    run_dirs = list((tmp_path / "wandb").glob("offline-run-*"))
    assert run_dirs and list(run_dirs[0].glob("run-*.wandb"))
    tables = list(run_dirs[0].glob("files/media/table/requests_*.table.json"))
    assert tables, "no requests table in the offline run"
    import json

    table = json.loads(tables[0].read_text())
    assert table["columns"][0] == "id" and 2 <= len(table["data"]) <= 4
