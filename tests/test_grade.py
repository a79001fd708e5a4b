"""``servelab grade``: fixed simulated workloads, the submission against the built-ins of its
kind, scored on goodput relative to the default stack; the same numbers on every run."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

from servelab.testing import servelab_plugin_manager
from servelab.core.errors import ServelabError
from servelab.kit.grade_workloads import WORKLOADS, workloads_for
from servelab.kit.grading import grade, main, to_csv, to_markdown
from servelab.kit.new_plugin import new_plugin
from servelab.core.registry import build_registry


@pytest.mark.slow  # every scheduler workload twice (a minute); twins: the in-process grades below
def test_the_cli_prints_a_table_and_writes_what_a_second_run_computes(tmp_path):
    out = tmp_path / "grade.csv"
    proc = subprocess.run([sys.executable, "-c", "from servelab.cli.main import main; main()", "grade",
                           "scheduler=priority", "--out", str(out)], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "COLUMNS": "200"})
    assert proc.returncode == 0, proc.stderr
    assert "scheduler=priority: score" in proc.stdout and "goodput vs fcfs" in proc.stdout
    for name in ("chat_burst", "long_prompts", "tight_pool", "slo_aware", "static", "TTFT p99 ms"):
        assert name in proc.stdout, name
    again = grade("scheduler", "priority")
    assert out.read_text() == to_csv([again])  # deterministic: another process, the same numbers
    rows = {(r.workload, r.policy): r for r in again.rows}
    assert all(rows[(w.name, "fcfs")].score == 1.0 for w in workloads_for("scheduler"))
    assert rows[("tight_pool", "fcfs")].preemptions > 0
    assert rows[("chat_burst", "priority")].score > 1.0  # the interactive class first meets more SLOs
    md = to_markdown([again])
    assert md.startswith("## scheduler=priority: score") and "| chat_burst | priority | 144/144 |" in md


def test_the_cli_prints_the_table_and_writes_the_csv_on_one_workload(tmp_path, monkeypatch, capsys):
    """The fast twin of the test above: the command's own path, in this process, on one workload."""
    import functools

    from servelab.kit import grading

    monkeypatch.setattr(grading, "grade", functools.partial(grade, workloads=WORKLOADS[:1]))
    out = tmp_path / "grade.csv"
    assert main(["scheduler=priority", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "scheduler=priority: score" in printed and WORKLOADS[0].name in printed and f"results: {out}" in printed
    header, *rows = out.read_text().splitlines()
    assert header.startswith("kind,submission,workload,policy,") and len(rows) == 8  # the built-in schedulers
    assert rows[0].split(",")[:4] == ["scheduler", "priority", WORKLOADS[0].name, "priority"]  # the submission first


def test_a_generated_submission_is_graded_first_against_every_builtin(tmp_path):
    root = new_plugin("scheduler", "my_policy", tmp_path)
    spec = importlib.util.spec_from_file_location("servelab_my_policy", root / "servelab_my_policy" / "__init__.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    pm = servelab_plugin_manager()  # the built-in policies and executors
    pm.register(module)
    g = grade("scheduler", "my_policy", registry=build_registry(pm), workloads=WORKLOADS[:1])
    assert [r.policy for r in g.rows] == ["my_policy", "fcfs", "lpm", "mlfq", "priority", "sjf", "slo_aware", "static",
                                         "vtc"]
    assert all(r.finished == r.requests == 144 for r in g.rows) and g.score == g.rows[0].score > 0


def test_a_router_is_graded_on_a_busy_cluster_against_every_builtin_router(tmp_path):
    root = new_plugin("router", "my_router", tmp_path)
    spec = importlib.util.spec_from_file_location("servelab_my_router", root / "servelab_my_router" / "__init__.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    pm = servelab_plugin_manager()
    pm.register(module)
    g = grade("router", "my_router", registry=build_registry(pm))
    assert [r.policy for r in g.rows] == ["my_router", "least_outstanding", "power_of_two", "prefix_affinity",
                                         "round_robin", "session"]
    rows = {r.policy: r for r in g.rows}
    assert all(r.workload == "cluster_chat" and r.finished == r.requests > 500 for r in g.rows)
    assert rows["round_robin"].score == 1.0 and g.score == rows["my_router"].score > 0
    # the workload shows the trade-off: placing for cache hits wins hits and the tail over round robin
    assert rows["prefix_affinity"].prefix_hit_rate > rows["round_robin"].prefix_hit_rate + 0.1
    assert rows["prefix_affinity"].ttft_p99_ms < rows["round_robin"].ttft_p99_ms and rows["prefix_affinity"].score > 1
    md = to_markdown([g])
    assert md.startswith("## router=my_router: score") and "goodput and TTFT p99 vs round_robin" in md
    assert "| prefix hit | score |" in md


@pytest.mark.parametrize("args, message", [
    (["drafter=ngram"], "grade: kind 'drafter' cannot be graded; kinds: scheduler, allocator, preemption, evictor, "
                        r"kv_tier_policy, router, migration_policy \(drafters, time models and length predictors change no simulated schedule worth "
                        r"scoring: docs/plugins.md\)$"),
    (["scheduler"], "expected <kind>=<name>"),
    (["scheduler=nope"], "unknown scheduler 'nope'"),
])
def test_bad_input_names_the_problem(args, message):
    with pytest.raises(ServelabError, match=message):
        main(args)
