"""Autoscaling on the simulator's cluster (servelab.cluster.autoscale): a started replica serves after
its priced cold start (at once from a warm pool) and takes requests only then; a retired one drains
(through migration when a policy moves requests), takes nothing new and is off once empty; every
request ends once with the tokens of a run without scaling; ``autoscaler=none`` builds nothing; bad
answers and bad keys are one line; the built-ins decide as their docstrings say."""

from __future__ import annotations

from dataclasses import replace

import pytest

from servelab.api import compose
from servelab.cluster.build import build_cluster, cluster_pools, is_cluster
from servelab.core.autoscaler import (Autoscaler, AutoscalerContext, AutoscalerError, AutoscaleView, ScaleDown,
                                      ScaleUp, checked_decisions)
from servelab.core.errors import ConfigError
from servelab.core.registry import Registry, default_registry
from servelab.core.migration_policy import ReplicaLoad, RequestLoad
from servelab.kit.conformance_autoscaler import bounds_problem
from servelab.plugins.autoscalers import SLOAutoscaler, ThresholdAutoscaler
from servelab.testing import check_plugin

from test_migration import SIM, leaked, outputs, requests, run

CONTEXT = AutoscalerContext(1, 3, 1.0, 2.0, 10_000.0)


def cluster_of(*overrides: str, replicas: int = 1, max_replicas: int = 2):
    cfg = compose([*SIM, f"cluster.replicas={replicas}", f"cluster.max_replicas={max_replicas}",
                   "autoscaler=threshold", "cluster.autoscale_interval_s=0.5", *overrides],
                  logger="none", progress=False)
    return build_cluster(cfg)[0]


class Scripted(Autoscaler):
    """Answers ``script[t]`` at the first question at or after each time ``t``."""

    name = "scripted"

    def __init__(self, script: dict[float, list]) -> None:
        super().__init__(None, CONTEXT)
        self.script = dict(script)

    def decide(self, view, now):
        due = [t for t in self.script if t <= now]
        return [d for t in sorted(due) for d in self.script.pop(t)]


def placements(cluster) -> list[tuple[float, int]]:
    """Every arrival's (time, replica), as the protocol places them (filled while the cluster runs)."""
    seen: list[tuple[float, int]] = []
    arrive = cluster.protocol.arrive

    def recording(request, t):
        r, asked = arrive(request, t)
        seen.append((t, r.index))
        return r, asked
    cluster.protocol.arrive = recording
    return seen


def spaced(n: int = 12, gap: float = 0.2, out: int = 100):
    return [r.__class__(r.id, r.prompt_token_ids, r.max_tokens, arrival_time=gap * i)
            for i, r in enumerate(requests(n=n, out=out))]


def run_end(cluster) -> float:
    return max(r.engine.now() for r in cluster.replicas)


def test_none_builds_one_engine_and_no_driver():
    cfg = compose([*SIM, "cluster.max_replicas=4"], logger="none", progress=False)
    assert not is_cluster(cfg)  # autoscaler=none: cluster.replicas=1 stays one engine, as today
    cfg = compose([*SIM, "cluster.replicas=2", "cluster.max_replicas=4"], logger="none", progress=False)
    assert cluster_pools(cfg)[0][1] == 2
    assert build_cluster(cfg)[0].autoscale is None


def test_a_started_replica_takes_requests_only_after_its_cold_start():
    reqs = spaced()
    reference = outputs(run(cluster_of("cluster.max_replicas=1"), reqs))
    cluster = cluster_of("cluster.cold_start_gb_s=16")
    cluster.autoscale.autoscaler = Scripted({0.5: [ScaleUp(1)]})
    seen = placements(cluster)
    ended = run(cluster, reqs)
    assert outputs(ended) == reference and len(ended) == len(reqs) and leaked(cluster) == 0
    sums = cluster.autoscale.sums
    cold = sums.cold_start_seconds
    assert sums.scale_up_events == 1 and 0.5 < cold < 2  # 8B bf16 weights (~16 GB) at 16 GB/s
    on_new = [t for t, index in seen if index == 1]
    assert on_new and min(on_new) >= 0.5 + cold
    assert all(index == 0 for t, index in seen if t < 0.5 + cold)
    assert sums.spans == [[0, 0.0, None], [1, 0.5, None]]


def test_a_warm_replica_serves_at_once():
    cluster = cluster_of("cluster.warm_pool=1")
    cluster.autoscale.autoscaler = Scripted({0.5: [ScaleUp(1)]})
    seen = placements(cluster)
    run(cluster, spaced())
    sums = cluster.autoscale.sums
    assert (sums.cold_start_seconds, sums.warm_starts) == (0.0, 1)
    assert min(t for t, index in seen if index == 1) >= 0.5


@pytest.mark.parametrize("migration", ["none", "drain"])
def test_a_retired_replica_drains_takes_nothing_new_and_goes_off_once_empty(migration):
    reqs = spaced(n=10, gap=0.1, out=300)
    reference = outputs(run(cluster_of(replicas=2, max_replicas=2), reqs))
    cluster = cluster_of(f"migration_policy={migration}", "cluster.migration_interval_s=0.25", "cluster.min_replicas=1", replicas=2,
                         max_replicas=2)
    cluster.autoscale.autoscaler = Scripted({0.5: [ScaleDown(1)]})
    seen = placements(cluster)
    ended = run(cluster, reqs)
    assert outputs(ended) == reference and leaked(cluster) == 0
    assert all(index == 0 for t, index in seen if t >= 0.5)
    driver = cluster.autoscale
    assert driver.state == ["serving", "off"] and driver.sums.scale_down_events == 1
    (_, _, retired), = [s for s in driver.sums.spans if s[0] == 1]
    assert retired is not None and retired > 0.5
    if migration == "drain":  # its running requests moved off: retired before the run's end
        assert cluster.migration.sums.done and retired < run_end(cluster)


def test_replica_seconds_and_gpu_hours_count_held_replicas_to_the_end():
    driver = cluster_of().autoscale
    driver.sums.spans = [[0, 0.0, None], [1, 2.0, 5.0], [1, 8.0, 30.0]]
    figures = driver.figures(10.0)
    assert figures["replica_seconds"] == 10.0 + 3.0 + 2.0
    assert figures["gpu_hours"] == pytest.approx(15.0 / 3600)


# ---- checked answers, the bounds, one-line config errors -----------------------------------------
def _view(num_starting: int = 0, draining: bool = False) -> AutoscaleView:
    q = RequestLoad("a", 0, 10, 2, 20, 1, 1)
    return AutoscaleView((ReplicaLoad(0, "mixed", 10, 16, 1, 9, running=(q,)),
                          ReplicaLoad(1, "mixed", 10, 16, 0, 10, draining=draining)), num_starting, 1, 3, (0.0, 0.0))


class Answer(Autoscaler):
    name = "answer"

    def __init__(self, answer) -> None:
        super().__init__(None, CONTEXT)
        self.answer = answer

    def decide(self, view, now):
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


@pytest.mark.parametrize("answer, view, says", [
    ([ScaleUp(2)], _view(), "above cluster.max_replicas=3"),
    ([ScaleUp(1)], _view(num_starting=1, draining=True), "above cluster.max_replicas=3"),
    ([ScaleUp(0)], _view(), "at least one replica"),
    ([ScaleDown(1)], _view(draining=True), "not a serving replica"),
    ([ScaleDown(5)], _view(), "not a serving replica"),
    ([ScaleDown(0), ScaleDown(0)], _view(num_starting=1), "not a serving replica"),
    ([ScaleDown(0), ScaleDown(1)], _view(num_starting=1), "no replica would be left serving"),
    ([ScaleDown(1)], AutoscaleView(_view().replicas, 0, 2, 3), "below cluster.min_replicas=2"),
    ([("up", 1)], _view(), "not a ScaleUp or ScaleDown"),
    (ValueError("boom"), _view(), "failed at t=0: ValueError: boom"),
])
def test_a_bad_answer_stops_the_run_naming_the_plugin(answer, view, says):
    with pytest.raises(AutoscalerError, match="autoscaler plugin 'answer'") as err:
        checked_decisions(Answer(answer), view, 0.0)
    assert says in str(err.value)
    assert checked_decisions(Answer([ScaleUp(1), ScaleDown(1)]), _view(), 0.0) == [ScaleUp(1), ScaleDown(1)]


def test_the_bounds_contract_names_the_first_question_outside_them():
    driver = cluster_of(max_replicas=3).autoscale
    driver.history = [(0.5, 1, 0, 1), (1.0, 2, 1, 3), (1.5, 2, 0, 4)]
    assert bounds_problem(driver) == ("at t=1.5: 2 serving, 0 starting, 4 holding GPUs (min_replicas=1, "
                                      "max_replicas=3)")
    driver.history = [(0.5, 0, 1, 1)]
    assert "0 serving" in (bounds_problem(driver) or "")


@pytest.mark.parametrize("overrides, message", [
    (["cluster.min_replicas=2"], "needs 1 <= min_replicas <= replicas"),
    (["cluster.max_replicas=0"], "needs 1 <= min_replicas <= replicas"),
    (["cluster.autoscale_interval_s=0"], "cluster.autoscale_interval_s=0.0 must be > 0"),
    (["cluster.cold_start_gb_s=0"], "cluster.cold_start_gb_s=0.0 must be > 0"),
    (["cluster.warm_pool=-1"], "cluster.warm_pool=-1 must be >= 0"),
    (["cluster.draining=[0]", "migration_policy=drain"], "the autoscaler drains replicas itself"),
    (["autoscaler.queue_low=9"], "autoscaler=threshold: needs 0 <= queue_low <= queue_high"),
])
def test_bad_autoscale_keys_are_one_line(overrides, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]")):
        cluster_of(*overrides)


def test_autoscaling_prefill_decode_pools_is_refused():
    cfg = compose([*SIM, "cluster.prefill_replicas=1", "cluster.decode_replicas=1", "autoscaler=slo"],
                  logger="none", progress=False)
    with pytest.raises(ConfigError, match="grows and shrinks colocated replicas"):
        build_cluster(cfg)


# ---- the built-ins ----------------------------------------------------------------------------------
def _loaded(waiting: int, used: int, index: int = 0, running: int = 1) -> ReplicaLoad:
    q = [RequestLoad(f"w{index}-{i}", index, 1000, 0, 100, 0, 63) for i in range(waiting)]
    r = [RequestLoad(f"r{index}-{i}", index, 100, 5, 100, 7, 7) for i in range(running)]
    return ReplicaLoad(index, "mixed", 100, 16, used, 100 - used, tuple(r), tuple(q))


def test_threshold_scales_up_on_queue_and_down_only_after_a_cool_down_of_low_marks():
    scaler = ThresholdAutoscaler(ThresholdAutoscaler.Config(cooldown_s=10.0), CONTEXT)
    busy = AutoscaleView((_loaded(8, 50),), 0, 1, 3)
    assert scaler.decide(busy, 0.0) == (ScaleUp(1),)
    assert scaler.decide(AutoscaleView((_loaded(8, 50),), 1, 1, 3), 1.0) == ()  # its replica is starting
    quiet = AutoscaleView((_loaded(0, 10, 0, running=2), _loaded(0, 10, 1)), 0, 1, 3)
    assert scaler.decide(quiet, 5.0) == ()  # low since 5 s
    assert scaler.decide(AutoscaleView((_loaded(8, 50), _loaded(0, 10, 1)), 1, 1, 3), 9.0) == ()  # a lull ended
    assert scaler.decide(quiet, 12.0) == ()  # low again since 12 s
    assert scaler.decide(quiet, 22.0) == (ScaleDown(1),)  # low for 10 s: the emptiest
    mid = AutoscaleView((_loaded(2, 50), _loaded(2, 50, 1)), 0, 1, 3)
    assert ThresholdAutoscaler(ThresholdAutoscaler.Config(), CONTEXT).decide(mid, 0.0) == ()  # the hysteresis band


def test_the_base_classs_rule_scales_up_first_and_retires_only_after_the_cool_down():
    scaler = Scripted({})  # any autoscaler has the helper; its own decide is not used here
    quiet = AutoscaleView((_loaded(0, 10, 0, running=2), _loaded(0, 10, 1), _loaded(0, 10, 2)), 0, 1, 3)
    assert scaler.scale_up_or_retire(quiet, 0.0, None, True, 5.0) == ()  # low since 0 s
    assert scaler.scale_up_or_retire(quiet, 4.0, None, True, 5.0) == ()
    assert scaler.scale_up_or_retire(quiet, 5.0, None, True, 5.0) == (ScaleDown(2),)  # fewest requests, highest index
    two = AutoscaleView(quiet.replicas[:2], 0, 1, 3)
    assert scaler.scale_up_or_retire(two, 6.0, None, True, 5.0) == ()  # 5 s after that decision, not before
    assert scaler.scale_up_or_retire(two, 8.0, ScaleUp(1), False, 5.0) == (ScaleUp(1),)  # up wins, resets the marks
    assert scaler.scale_up_or_retire(two, 12.0, None, True, 5.0) == ()  # low again only since 12 s
    starting = AutoscaleView(two.replicas, 1, 1, 3)
    assert scaler.scale_up_or_retire(starting, 30.0, None, True, 5.0) == ()  # a cold start under way
    draining = AutoscaleView((two.replicas[0], replace(two.replicas[1], draining=True)), 0, 1, 3)
    assert scaler.scale_up_or_retire(draining, 31.0, None, True, 5.0) == ()  # a drain under way
    assert scaler.scale_up_or_retire(two, 32.0, None, True, 5.0) == (ScaleDown(1),)


def test_slo_predicts_first_token_latency_from_the_oldest_wait_and_the_queue():
    scaler = SLOAutoscaler(SLOAutoscaler.Config(ttft_ms=1000.0), CONTEXT)
    view = AutoscaleView((_loaded(20, 50),), 0, 1, 3, (0.2,))
    predicted, queued = scaler.predicted_ttft_s(view)
    assert queued == 20_000 and predicted > 2.0  # 20k queued tokens at 10k tokens/s
    assert scaler.decide(view, 0.0) == (ScaleUp(1),)  # clearing 20k tokens in 1 s needs 2: one more (max_replicas 3)
    held = AutoscaleView((_loaded(0, 50),), 0, 1, 3, (1.5,))  # nothing queued, yet one waited 1.5 s: full blocks
    assert SLOAutoscaler(SLOAutoscaler.Config(ttft_ms=1000.0), CONTEXT).decide(held, 0.0) == (ScaleUp(1),)


# ---- the kit ----------------------------------------------------------------------------------------
def test_the_kit_passes_none():
    report = check_plugin("autoscaler", "none")
    assert report.ok, report


@pytest.mark.slow
@pytest.mark.parametrize("name", ["threshold", "slo"])
def test_every_scaling_builtin_passes_the_kit(name):
    report = check_plugin("autoscaler", name)
    assert report.ok, report
    assert "0 scaling events" not in " ".join(report.notes)


def test_the_kit_catches_an_autoscaler_that_breaks_the_bounds():
    class Greedy(Autoscaler):
        """Asks for a replica at every question, whatever the bounds say."""

        name = "greedy"

        def decide(self, view, now):
            return [ScaleUp(1)]

    installed = default_registry()
    registry = Registry({kind: dict(plugins) for kind, plugins in installed.plugins.items()}, dict(installed.origins))
    registry.add("autoscaler", Greedy, "this test")
    report = check_plugin("autoscaler", "greedy", registry=registry)
    assert not report.ok and "valid scaling" in str(report)
