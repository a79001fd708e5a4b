"""The router of docs/write-a-router.md registers, composes as ``router=least_kv``, validates its
key, passes the conformance kit, runs a simulated cluster, and the page's own unit test passes; the
page's study loads its cluster so that the routers it names differ as its table says."""

import re
import shlex
import sys

import pytest

from conftest import compose
from doc_plugins import DOCS, page_code_blocks, register_page_plugin
from servelab.core.errors import ConfigError
from servelab.testing import check_plugin
from servelab.run import cluster_run

PAGE = "write-a-router.md"
MODULE = "servelab_least_kv"  # the example's module, as its entry point names it


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    code = page_code_blocks(PAGE)[1]  # the complete example
    return register_page_plugin(code, tmp_path_factory.mktemp("doc_plugin"), MODULE)


def _run(registry, monkeypatch, tmp_path, *overrides):
    return cluster_run.run_cluster_job(compose(*overrides), tmp_path, registry=registry).summary


def _cluster_run(registry, monkeypatch, tmp_path, *overrides):
    return _run(registry, monkeypatch, tmp_path, "backend=sim", "model=llama3_8b", "cluster.replicas=4",
                "router=least_kv", "workload=chat_sessions", "workload.num_sessions=12", *overrides)


def _study() -> tuple[list[str], list[str], dict[str, list[str]]]:
    """The page's study: its sweep's overrides (the router and hydra's left out), the routers it
    sweeps, and its table (router -> cells)."""
    text = (DOCS / PAGE).read_text()
    command = next(line for line in text.replace("\\\n", " ").splitlines()
                   if line.startswith(("python run.py -m", "servelab -m")))
    words = shlex.split(command)
    args = words[words.index("-m") + 1:]
    routers = next(a for a in args if a.startswith("router=")).split("=", 1)[1].split(",")
    overrides = [a for a in args if not a.startswith(("router=", "hydra."))]
    rows = text[text.index("| router | TTFT p50 s"):].split("\n\n")[0]
    table = {m[1]: [c.strip() for c in m[2].split("|")] for m in re.finditer(r"^\| `(\w+)` \|(.*)\|$", rows, re.M)}
    return overrides, routers, table


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


def test_the_pages_study_loads_the_cluster_and_shows_the_trade_off(registry, monkeypatch, tmp_path):
    overrides, routers, table = _study()
    assert {"round_robin", "least_outstanding", "prefix_affinity", "session", "least_kv"} <= set(routers)
    runs = {r: _run(registry, monkeypatch, tmp_path / r, *overrides, f"router={r}")
            for r in ("least_outstanding", "prefix_affinity")}
    for router, s in runs.items():
        assert s["num_finished"] == s["num_requests"] == 340
        assert s["ttft_ms"]["p50"] > 200  # loaded: requests queue (an idle cluster's TTFT is tens of ms)
        assert min(r["busy_fraction"] for r in s["per_replica"]) > 0.6
        p50, p99, hit = table[router][:3]  # the page's numbers are these runs'
        assert (p50, p99, hit) == (f"{s['ttft_ms']['p50'] / 1e3:.3f}", f"{s['ttft_ms']['p99'] / 1e3:.2f}",
                                   f"{100 * s['prefix_cache_hit_rate']:.1f}%"), router
    cache, load = runs["prefix_affinity"], runs["least_outstanding"]
    assert cache["prefix_cache_hit_rate"] > load["prefix_cache_hit_rate"] + 0.1  # placing for hits wins hits
    assert cache["ttft_ms"]["p99"] > load["ttft_ms"]["p99"]  # ... and concentrates load: a longer tail


def test_the_pages_unit_test_passes(registry, monkeypatch):
    module = type(sys)(MODULE)
    exec(page_code_blocks(PAGE)[1], module.__dict__)  # what `pip install` of the package would import
    monkeypatch.setitem(sys.modules, MODULE, module)
    namespace = {}
    exec(page_code_blocks(PAGE)[2], namespace)
    tests = [fn for name, fn in namespace.items() if name.startswith("test_")]
    assert len(tests) == 3
    for test in tests:
        test()
