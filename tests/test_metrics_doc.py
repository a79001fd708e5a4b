"""Every key a ``summary.json`` holds is defined once in docs/metrics.md (linked from the README)."""

from __future__ import annotations

import re

import pytest

from conftest import REPO, compose
from servelab.core.request import Request
from servelab.run.session import run_job
from servelab.assemble.stack import build_stack
from servelab.kit.testing import FakeExecutor, VirtualClock

DOC = REPO / "docs" / "metrics.md"


def documented() -> list[str]:
    """The names of the table's first column."""
    return re.findall(r"^\| `([^`]+)` \|", DOC.read_text(), flags=re.M)


def _fake_summary(tmp_path, *overrides, swap_blocks=0):
    cfg = compose(*overrides, "num_kv_blocks=6", "block_size=4")
    clock = VirtualClock()
    executor = FakeExecutor(clock, 6, num_swap_blocks=swap_blocks)
    requests = [Request(f"r{i}", tuple(range(1, 10)), 6) for i in range(4)] + [Request("bad", (), 2)]
    return run_job(cfg, tmp_path, requests, build_stack(cfg, executor=executor, clock=clock)).summary


@pytest.mark.parametrize("overrides, swap", [(("preemption=swap", "slo.ttft_ms=100"), 16),
                                             (("allocator=contiguous",), 0)])
def test_every_summary_key_is_documented(tmp_path, overrides, swap):
    names = documented()
    assert len(names) == len(set(names)), "a metric is documented twice"
    summary = _fake_summary(tmp_path, *overrides, swap_blocks=swap)
    assert summary["num_finished"] == 4 and summary["num_rejected"] == 1
    missing = sorted(set(summary) - set(names))
    assert not missing, f"summary.json keys missing from docs/metrics.md: {missing}"


def test_simulator_keys_are_documented(tmp_path):
    cfg = compose("backend=sim", "model=llama3_8b", "workload.num_requests=4")
    summary = run_job(cfg, tmp_path).summary
    missing = sorted(set(summary) - set(documented()))
    assert not missing, f"summary.json keys missing from docs/metrics.md: {missing}"


def test_readme_links_the_metrics_table():
    assert "docs/metrics.md" in (REPO / "README.md").read_text()


def test_cluster_keys_are_documented(tmp_path):
    cfg = compose("backend=sim", "model=llama3_8b", "workload.num_requests=6", "cluster.prefill_replicas=1",
                  "cluster.decode_replicas=1")
    summary = run_job(cfg, tmp_path).summary
    missing = sorted(set(summary) - set(documented()))
    assert not missing, f"summary.json keys missing from docs/metrics.md: {missing}"
