"""SLO classes of a synthetic workload (``workload.slo_classes``): drawn per request with the workload's
seed, carried as the request's own targets exactly like a jsonl line's ``ttft_slo_ms`` / ``tpot_slo_ms``,
reported per class in ``summary.json``; and the grade workloads selectable by name
(``workload=grade workload.grade=<name>``, ``experiment=grade_<workload>``)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import compose
from servelab.core.errors import ConfigError
from servelab.kit.grade_workloads import SIM, WORKLOADS
from servelab.run.session import run_job
from servelab.workloads.build import WorkloadError, build_requests
from servelab.workloads.grade import GRADE_REQUESTS

# The override docs/configuration.md shows (#slo-classes), verbatim.
CLASSES = ("workload.slo_classes=[{name:chat,share:3,ttft_ms:200,tpot_ms:40},"
           "{name:batch,share:1,ttft_ms:5000,priority:1}]")
SIM_RUN = ("backend=sim", "model=llama3_8b", "hardware=h100", "workload=synthetic", "workload.rate=30")


def _reqs(*overrides, vocab=100):
    return list(build_requests(compose(*overrides).workload, vocab, 2048))


def test_the_documented_override_draws_a_class_per_request_and_keeps_the_workload():
    plain = _reqs("workload.num_requests=2000")
    classed = _reqs("workload.num_requests=2000", CLASSES)
    assert [(r.id, r.prompt_token_ids, r.max_tokens, r.arrival_time) for r in classed] == \
        [(r.id, r.prompt_token_ids, r.max_tokens, r.arrival_time) for r in plain]
    assert {r.slo_class for r in plain} == {None}
    chat = [r for r in classed if r.slo_class == "chat"]
    batch = [r for r in classed if r.slo_class == "batch"]
    assert len(chat) + len(batch) == 2000 and 0.72 < len(chat) / 2000 < 0.78  # 3 / (3 + 1)
    assert {(r.ttft_slo_ms, r.tpot_slo_ms, r.priority) for r in chat} == {(200.0, 40.0, 0)}
    assert {(r.ttft_slo_ms, r.tpot_slo_ms, r.priority) for r in batch} == {(5000.0, None, 1)}


def test_the_override_is_the_one_the_docs_show():
    from conftest import REPO

    page = (REPO / "docs" / "configuration.md").read_text()
    assert f"'{CLASSES}'" in page, "docs/configuration.md#slo-classes shows another override than this test runs"


def test_the_draws_follow_the_workload_seed():
    first = [r.slo_class for r in _reqs("workload.num_requests=50", CLASSES)]
    assert first == [r.slo_class for r in _reqs("workload.num_requests=50", CLASSES)]
    assert first != [r.slo_class for r in _reqs("workload.num_requests=50", CLASSES, "seed=1")]


@pytest.mark.parametrize("classes, message", [
    ("[{name:a,share:0}]", r"workload.slo_classes\[0\].share=0.0 must be > 0"),
    ("[{name:a},{name:a}]", r"workload.slo_classes\[1\].name='a' repeats workload.slo_classes\[0\].name"),
    ("[{share:1}]", r"workload.slo_classes\[0\].name='': every SLO class needs a non-empty name"),
    ("[{name:a,ttft_ms:-5}]", r"workload.slo_classes\[0\].ttft_ms=-5.0 must be > 0"),
])
def test_a_bad_class_is_one_line_naming_the_key(classes, message):
    with pytest.raises(ConfigError, match=message):
        _reqs("workload.num_requests=5", f"workload.slo_classes={classes}")


def test_per_request_targets_behave_exactly_like_jsonl_lines(tmp_path):
    """The same requests, once drawn from classes and once read from a jsonl file with each line's
    ttft_slo_ms / tpot_slo_ms / priority / slo_class: identical records and summaries, the class's
    missing TPOT falling back to slo.tpot_ms in both."""
    overrides = (*SIM_RUN, "workload.num_requests=80", "slo.tpot_ms=25")
    synthetic = run_job(compose(*overrides, CLASSES), tmp_path / "synthetic")
    lines = [{"id": r.id, "prompt_token_ids": list(r.prompt_token_ids), "max_tokens": r.max_tokens,
              "arrival_time": r.arrival_time, "ttft_slo_ms": r.ttft_slo_ms, "tpot_slo_ms": r.tpot_slo_ms,
              "priority": r.priority, "slo_class": r.slo_class}
             for r in build_requests(compose(*overrides, CLASSES).workload, 128256, 2048)]
    path = tmp_path / "requests.jsonl"
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    jsonl = run_job(compose(*overrides[:3], "workload=jsonl", f"workload.path={path}", "slo.tpot_ms=25"),
                    tmp_path / "jsonl")
    keys = ("met_slo", "met_ttft_slo", "met_tpot_slo", "slo_class", "ttft_ms", "priority")
    assert [[r[k] for k in keys] for r in synthetic.requests] == [[r[k] for k in keys] for r in jsonl.requests]
    for key in ("slo_attainment", "ttft_slo_attainment", "tpot_slo_attainment", "goodput_req_s", "slo_classes"):
        assert synthetic.summary[key] == jsonl.summary[key], key


def test_summary_reports_each_class(tmp_path):
    summary = run_job(compose(*SIM_RUN, "workload.num_requests=120", "workload.rate=60", CLASSES), tmp_path).summary
    classes = summary["slo_classes"]
    assert sorted(classes) == ["batch", "chat"]
    assert classes["chat"]["num_requests"] + classes["batch"]["num_requests"] == summary["num_requests"]
    for figure in ("num_requests_with_slo",):
        assert classes["chat"][figure] + classes["batch"][figure] == summary[figure]
    met = sum(c["slo_attainment"] * c["num_requests_with_slo"] for c in classes.values())
    assert met == pytest.approx(summary["slo_attainment"] * summary["num_requests_with_slo"])
    assert classes["batch"]["tpot_slo_attainment"] is None  # the batch class has no TPOT target, nor the run
    assert classes["chat"]["ttft_ms"]["p99"] is not None
    plain = run_job(compose(*SIM_RUN, "workload.num_requests=20"), tmp_path / "plain").summary
    assert plain["slo_classes"] is None


# ---- the grade workloads, by name ---------------------------------------------------------------

@pytest.mark.parametrize("workload", WORKLOADS, ids=lambda w: w.name)
def test_each_grade_workload_is_selectable_by_name(workload):
    generator = workload.requests.__name__
    assert GRADE_REQUESTS[generator] is workload.requests
    cfg = compose(*SIM, "workload=grade", f"workload.grade={generator}")
    assert build_requests(cfg.workload, 128256, 8192) == workload.requests()


def test_an_unknown_grade_workload_is_one_line():
    with pytest.raises(WorkloadError, match="workload.grade='chat' is not one of chat_burst, long_prompts"):
        _reqs("workload=grade", "workload.grade=chat")


def test_a_small_vocabulary_gets_the_ids_modulo_its_size():
    requests = _reqs("workload=grade", "workload.grade=long_prompts", vocab=512)
    assert max(max(r.prompt_token_ids) for r in requests) < 512
    assert [r.prompt_len for r in requests] == [r.prompt_len for r in GRADE_REQUESTS["long_prompts"]()]


def test_the_grade_experiment_preset_runs_what_grade_runs(tmp_path):
    """``experiment=grade_long_prompts`` is the run ``servelab grade`` makes of long_prompts for the
    default stack: the same figures as grade's fcfs row."""
    from servelab.kit.grading import _run
    from servelab.core.registry import default_registry

    workload = next(w for w in WORKLOADS if w.name == "long_prompts")
    row = _run("scheduler", "fcfs", workload, workload.requests(), default_registry())
    from servelab.api import compose as api_compose

    summary = run_job(api_compose(["experiment=grade_long_prompts"], logger="none", progress=False), tmp_path).summary
    assert summary["goodput_req_s"] == pytest.approx(row.goodput_req_s)
    assert summary["ttft_ms"]["p99"] == pytest.approx(row.ttft_p99_ms)
    assert summary["num_finished"] == row.finished and summary["num_requests"] == row.requests
    assert np.isclose(summary["output_throughput_tok_s"], row.throughput_tok_s)
