"""The drafter of docs/write-a-drafter.md registers, composes as ``drafter=adaptive_repeat``,
leaves greedy outputs of the trained model unchanged, saves steps, and adapts its k."""

import pytest

from doc_plugins import page_code_blocks, register_page_plugin
from servelab.api import compose
from servelab.core.errors import ConfigError
from servelab.run.runner import run_workload
from servelab.run.session import collect_results
from servelab.assemble.stack import build_stack
from servelab.workloads.text import checkpoint_text
from servelab.workloads.build import build_requests

BASE = ["model=tiny_code", "workload=corpus", "workload.num_requests=6", "workload.arrival=all_at_once",
        "workload.max_tokens=48", "backend.num_threads=1"]


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    code = page_code_blocks("write-a-drafter.md")[1]  # the complete example
    return register_page_plugin(code, tmp_path_factory.mktemp("doc_plugin"), "doc_adaptive_repeat")


def _run(registry, drafter):
    cfg = compose([*BASE, drafter], logger="none", progress=False)
    stack = build_stack(cfg, registry)
    requests = build_requests(cfg.workload, stack.executor.spec.vocab_size, stack.limits.max_model_len,
                              checkpoint_text(cfg))
    run_workload(stack.engine, requests)
    return collect_results(stack.engine, 1.0), stack.engine.drafter


def test_the_pages_drafter_keeps_outputs_and_saves_steps(registry):
    plain, _ = _run(registry, "drafter=none")
    spec, drafter = _run(registry, "drafter=adaptive_repeat")
    assert {r["id"]: r["output_token_ids"] for r in spec.requests} == \
        {r["id"]: r["output_token_ids"] for r in plain.requests}
    s = spec.summary
    assert s["num_accepted_tokens"] > 0 and s["num_steps"] < plain.summary["num_steps"]
    assert s["leaked_blocks"] == 0
    assert drafter.k_of == {}  # every finished sequence forgotten


def test_the_pages_drafter_validates_k(registry):
    with pytest.raises(ConfigError, match="drafter.k=0 must be between 1 and 16"):
        build_stack(compose(["model=tiny_code", "drafter=adaptive_repeat", "drafter.k=0"], logger="none"), registry)


def test_the_pages_drafter_passes_the_conformance_kit_and_leaves_no_state(registry):
    """The facts the page states: forget() comes for finished and aborted sequences, never a
    preemption; the kit's "state left behind" contract runs all three."""
    from servelab.testing import check_plugin

    report = check_plugin("drafter", "adaptive_repeat", registry=registry, cases=3, real_model=False)
    assert report.ok, str(report)
