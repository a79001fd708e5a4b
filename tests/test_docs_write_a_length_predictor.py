"""The predictor of docs/write-a-length-predictor.md registers, composes as
``length_predictor=prompt_ratio``, orders ``scheduler=sjf`` by prompt length, validates its key,
passes the conformance kit, and the page's own unit test passes."""

import sys

import pytest

from conftest import compose
from doc_plugins import page_code_blocks, register_page_plugin
from servelab.core.errors import ConfigError
from servelab.core.request import Request
from servelab.kit.testing import FakeExecutor, VirtualClock
from servelab.run.runner import run_workload
from servelab.assemble.stack import build_stack

PAGE = "write-a-length-predictor.md"


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    code = page_code_blocks(PAGE)[1]  # the complete example
    return register_page_plugin(code, tmp_path_factory.mktemp("doc_plugin"), "prompt_ratio")


def _fake_stack(registry, *overrides):
    cfg = compose("scheduler=sjf", "length_predictor=prompt_ratio", *overrides)
    clock = VirtualClock()
    return build_stack(cfg, registry, executor=FakeExecutor(clock, num_kv_blocks=256), clock=clock), clock


def test_the_pages_predictor_orders_sjf_by_prompt_length(registry):
    stack, clock = _fake_stack(registry, "max_num_seqs=1")
    requests = [Request(f"p{n}", tuple(range(1, n + 1)), 64) for n in (60, 10, 40, 20)]
    run_workload(stack.engine, requests, sleep=clock.sleep)
    order = []
    for step in stack.engine.steps:
        order += [rid for rid, _ in step.scheduled if rid not in order]
    assert order == ["p10", "p20", "p40", "p60"]
    assert stack.engine.sequences["p40"].predicted_output_len == 20.0


def test_the_pages_predictor_validates_its_key(registry):
    with pytest.raises(ConfigError, match=r"^length_predictor=prompt_ratio: length_predictor.ratio=-1.0 must be >= 0$"):
        _fake_stack(registry, "length_predictor.ratio=-1")


def test_the_pages_predictor_passes_the_conformance_kit(registry):
    from servelab.testing import check_plugin

    report = check_plugin("length_predictor", "prompt_ratio", registry=registry, cases=3, real_model=False)
    assert report.ok, str(report)


def test_the_pages_unit_test_passes(registry, monkeypatch):
    module = type(sys)("prompt_ratio")
    exec(page_code_blocks(PAGE)[1], module.__dict__)  # what `pip install` of the package would import
    monkeypatch.setitem(sys.modules, "prompt_ratio", module)
    test_code = page_code_blocks(PAGE)[2]
    namespace = {}
    exec(test_code, namespace)
    tests = [fn for name, fn in namespace.items() if name.startswith("test_")]
    assert tests
    for test in tests:
        test()
