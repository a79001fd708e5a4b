"""The router of docs/write-a-router.md registers, composes as ``router=least_kv``, validates its
key, passes the conformance kit, runs a simulated cluster, and the page's own unit test passes."""

import sys

import pytest

from conftest import compose
from doc_plugins import page_code_blocks, register_page_plugin
from servelab.core.errors import ConfigError
from servelab.testing import check_plugin
from servelab.run import cluster_build, cluster_run
from servelab.run.session import run_job

PAGE = "write-a-router.md"


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    code = page_code_blocks(PAGE)[1]  # the complete example
    return register_page_plugin(code, tmp_path_factory.mktemp("doc_plugin"), "least_kv")


def _cluster_run(registry, monkeypatch, tmp_path, *overrides):
    monkeypatch.setattr(cluster_run, "build_cluster",
                        lambda cfg, requests: cluster_build.build_cluster(cfg, requests, registry))
    cfg = compose("backend=sim", "model=llama3_8b", "cluster.replicas=4", "router=least_kv", "workload=chat_sessions",
                  "workload.num_sessions=12", *overrides)
    return run_job(cfg, tmp_path).summary


def test_the_pages_router_runs_a_simulated_cluster(registry, monkeypatch, tmp_path):
    summary = _cluster_run(registry, monkeypatch, tmp_path)
    assert summary["router"] == "least_kv" and summary["num_replicas"] == 4
    assert summary["num_finished"] == sum(r["num_requests"] for r in summary["per_replica"]) > 0
    assert sum(r["num_requests"] > 0 for r in summary["per_replica"]) >= 3


def test_the_pages_router_validates_its_key(registry, monkeypatch, tmp_path):
    with pytest.raises(ConfigError, match=r"^router=least_kv: router.outstanding_weight=-1 must be >= 0$"):
        _cluster_run(registry, monkeypatch, tmp_path, "router.outstanding_weight=-1")


def test_the_pages_router_passes_the_conformance_kit(registry):
    report = check_plugin("router", "least_kv", registry=registry, cases=10)
    assert report.ok, str(report)


def test_the_pages_unit_test_passes(registry, monkeypatch):
    module = type(sys)("least_kv")
    exec(page_code_blocks(PAGE)[1], module.__dict__)  # what `pip install` of the package would import
    monkeypatch.setitem(sys.modules, "least_kv", module)
    namespace = {}
    exec(page_code_blocks(PAGE)[2], namespace)
    tests = [fn for name, fn in namespace.items() if name.startswith("test_")]
    assert len(tests) == 3
    for test in tests:
        test()
