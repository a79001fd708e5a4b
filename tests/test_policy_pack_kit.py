"""The conformance kit and the grader for policy pack I: overrides after the plugin, the
``length_predictor`` kind, companions a plugin cannot run without, and the fairness workload."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from servelab.testing import servelab_plugin_manager
from servelab.core.errors import ConfigError
from servelab.core.hookspecs import hookimpl
from servelab.core.interfaces import LengthPredictor
from servelab.core.registry import Registry, build_registry
from servelab.kit.conformance import check_plugin, main, merge_overrides
from servelab.kit.grade_workloads import WORKLOADS, fairness_flood, workloads_for
from servelab.kit.grading import grade


def test_merge_overrides_replaces_the_same_keys_and_keeps_the_rest():
    base = ("scheduler=fcfs", "block_size=4", "allocator.prefix_caching=true")
    assert merge_overrides(base, ("scheduler=sjf", "+foo=1", "allocator.prefix_caching=false")) == (
        "block_size=4", "scheduler=sjf", "+foo=1", "allocator.prefix_caching=false")


def test_check_plugin_command_takes_overrides_after_the_plugin(capsys):
    assert main(["scheduler=mlfq", "scheduler.quanta=[2,4]", "preemption=swap", "--cases", "3",
                 "--no-real-model"]) == 0
    assert "scheduler=mlfq: PASS (3 random scenarios)" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        main(["scheduler=mlfq", "not-an-override", "--cases", "1"])


def test_a_bad_override_is_one_line_at_start_up():
    with pytest.raises(ConfigError, match=r"scheduler.quanta=\[4, 2\] must be .* strictly increasing"):
        check_plugin("scheduler", "mlfq", cases=1, real_model=False, overrides=("scheduler.quanta=[4,2]",))


def test_a_scheduler_that_needs_predictions_is_checked_with_the_oracle():
    report = check_plugin("scheduler", "sjf", cases=3, real_model=False)
    assert report.ok, report
    assert any("length_predictor=oracle" in note for note in report.notes)


@pytest.mark.parametrize("name", ["oracle", "noisy_oracle"])
def test_length_predictors_pass_the_kit(name):
    report = check_plugin("length_predictor", name, cases=3, real_model=False)
    assert report.ok, report
    assert any("scheduler=sjf" in note for note in report.notes)


@dataclass
class _NoConfig:
    pass


class NegativePredictor(LengthPredictor):
    name = "negative"
    Config = _NoConfig

    def predict(self, request):
        return -1.0


class MoodyPredictor(LengthPredictor):
    """Different answers on every call: the kit's ``predictions`` contract catches it."""

    name = "moody"
    Config = _NoConfig
    calls = 0

    def predict(self, request):
        MoodyPredictor.calls += 1
        return float(MoodyPredictor.calls)


class _Bad:
    @hookimpl
    def servelab_register_length_predictors(self):
        return [NegativePredictor, MoodyPredictor]


def _registry() -> Registry:
    pm = servelab_plugin_manager()  # the built-in policies and executors
    pm.register(_Bad())
    return build_registry(pm)


def test_a_predictor_returning_a_negative_length_fails_naming_itself_and_the_request():
    report = check_plugin("length_predictor", "negative", registry=_registry(), cases=1, real_model=False)
    assert report.contracts_broken == ["plugin raised"]
    assert "length_predictor plugin 'negative' on request" in str(report) and "finite number >= 0" in str(report)


def test_a_predictor_that_changes_its_mind_breaks_the_predictions_contract():
    report = check_plugin("length_predictor", "moody", registry=_registry(), cases=0, real_model=False)
    assert report.contracts_broken == ["predictions"]


def test_the_fairness_workload_has_a_flooding_and_a_steady_client():
    requests = fairness_flood()
    by_client = {c: [r for r in requests if r.client_id == c] for c in ("steady", "flood")}
    assert len(by_client["flood"]) > 5 * len(by_client["steady"]) > 0
    assert [w.name for w in workloads_for("scheduler")][-1] == "fairness_flood"  # added last: grades do not move


@pytest.mark.slow
def test_grade_scores_vtc_above_fcfs_on_the_fairness_workload():
    workload = next(w for w in WORKLOADS if w.name == "fairness_flood")
    g = grade("scheduler", "vtc", workloads=(workload,))
    rows = {r.policy: r for r in g.rows}
    assert rows["fcfs"].score == 1.0 and rows["vtc"].score > 1.5
    assert rows["vtc"].jain_fairness_index > rows["fcfs"].jain_fairness_index
