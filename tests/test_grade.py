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


def test_a_generated_submission_is_graded_first_against_every_builtin(tmp_path):
    root = new_plugin("scheduler", "my_policy", tmp_path)
    spec = importlib.util.spec_from_file_location("my_policy", root / "my_policy" / "__init__.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    pm = servelab_plugin_manager()  # the built-in policies and executors
    pm.register(module)
    g = grade("scheduler", "my_policy", registry=build_registry(pm), workloads=WORKLOADS[:1])
    assert [r.policy for r in g.rows] == ["my_policy", "fcfs", "lpm", "mlfq", "priority", "sjf", "slo_aware", "static",
                                         "vtc"]
    assert all(r.finished == r.requests == 144 for r in g.rows) and g.score == g.rows[0].score > 0


@pytest.mark.parametrize("args, message", [
    (["drafter=ngram"], "grade: kind 'drafter' cannot be graded; kinds: scheduler, allocator, preemption, evictor"),
    (["scheduler"], "expected <kind>=<name>"),
    (["scheduler=nope"], "unknown scheduler 'nope'"),
])
def test_bad_input_names_the_problem(args, message):
    with pytest.raises(ServelabError, match=message):
        main(args)
