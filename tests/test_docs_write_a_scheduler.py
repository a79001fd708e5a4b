"""The last code block of docs/write-a-scheduler.md is a working plugin: it registers through a
pluggy PluginManager, composes as ``scheduler=spf`` and admits shortest prompts first."""

import pytest

from doc_plugins import page_code_blocks, register_page_plugin
from servelab.api import compose
from servelab.core.request import Request
from servelab.run.runner import run_workload
from servelab.assemble.stack import build_stack
from servelab.kit.testing import FakeExecutor, VirtualClock


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    code = page_code_blocks("write-a-scheduler.md")[-1]
    assert len(code.strip().splitlines()) < 40, "the complete plugin should stay under ~40 lines"
    return register_page_plugin(code, tmp_path_factory.mktemp("doc_plugin"), "doc_spf")


@pytest.mark.parametrize("longest_first, expected", [(False, ["p10", "p30", "p50"]), (True, ["p50", "p30", "p10"])])
def test_the_pages_plugin_admits_by_prompt_length(registry, longest_first, expected):
    cfg = compose(["scheduler=spf", "max_num_seqs=1", f"scheduler.longest_first={str(longest_first).lower()}"],
                  logger="none")
    clock = VirtualClock()
    engine = build_stack(cfg, registry, executor=FakeExecutor(clock, num_kv_blocks=64), clock=clock).engine
    run_workload(engine, [Request(f"p{n}", tuple(range(n)), max_tokens=2) for n in (50, 10, 30)], sleep=clock.sleep)
    first = {s.id: s.first_scheduled_time for s in engine.sequences.values()}
    assert sorted(first, key=first.get) == expected
    assert engine.allocator.leaked_blocks() == 0


def test_its_parameter_is_type_checked(registry):
    with pytest.raises(Exception, match="longest_first"):
        compose(["scheduler=spf", "scheduler.longest_first=maybe"], logger="none")


@pytest.fixture(scope="module")
def bounded_registry(tmp_path_factory):
    code = next(c for c in page_code_blocks("write-a-scheduler.md") if "time_dependent_key = True" in c)
    return register_page_plugin(code, tmp_path_factory.mktemp("doc_plugin"), "doc_spf_bounded")


@pytest.mark.parametrize("max_wait_s, long_goes_last", [(100.0, True), (0.1, False)])
def test_the_pages_starvation_bound_admits_a_long_prompt_that_waited(bounded_registry, max_wait_s, long_goes_last):
    cfg = compose(["scheduler=spf_bounded", "max_num_seqs=1", f"scheduler.max_wait_s={max_wait_s}"], logger="none")
    clock = VirtualClock()
    engine = build_stack(cfg, bounded_registry, executor=FakeExecutor(clock, num_kv_blocks=64), clock=clock).engine
    shorts = [Request(f"s{i}", tuple(range(10)), max_tokens=4, arrival_time=0.01 * i) for i in range(40)]
    run_workload(engine, [Request("long", tuple(range(200)), max_tokens=2), *shorts], sleep=clock.sleep)
    first = {s.id: s.first_scheduled_time for s in engine.sequences.values()}
    assert (max(first, key=first.get) == "long") == long_goes_last
    if not long_goes_last:  # within the bound: before every short one that arrived after it expired
        assert all(first["long"] < first[r.id] for r in shorts if r.arrival_time > max_wait_s)
    assert engine.allocator.leaked_blocks() == 0


def test_the_pages_starvation_bound_passes_the_kits_check(bounded_registry):
    from servelab.testing import check_plugin

    report = check_plugin("scheduler", "spf_bounded", registry=bounded_registry, cases=2, real_model=False)
    assert report.ok, str(report)


def test_the_pages_test_section_needs_only_the_two_facades_and_passes(tmp_path):
    """Section 3 ("Test it without a model") runs as written, importing only servelab.plugin_api
    (the contract) and servelab.testing (the doubles and a stack on them)."""
    import ast
    import importlib.util

    block = next(c for c in page_code_blocks("write-a-scheduler.md") if "registry_with(my_plugin_module)" in c)
    imported = {node.module for node in ast.walk(ast.parse(block)) if isinstance(node, ast.ImportFrom)}
    assert imported == {"servelab.plugin_api", "servelab.testing"}, imported
    path = tmp_path / "doc_spf_section3.py"
    path.write_text(page_code_blocks("write-a-scheduler.md")[-1])
    spec = importlib.util.spec_from_file_location("doc_spf_section3", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    exec(compile(block, "write-a-scheduler.md#3", "exec"), {"my_plugin_module": module})  # its asserts run


@pytest.mark.parametrize("own, default, expected_ms", [(200.0, 500.0, 200.0), (None, 500.0, 500.0), (None, None, None)])
def test_the_pages_slo_target_snippet_gives_the_target_a_request_is_measured_against(own, default, expected_ms):
    """Section 1's snippet: a request's own target wins over the run's slo.ttft_ms (limits), as
    requests.jsonl's met_slo and slo_aware read them."""
    from types import SimpleNamespace

    from servelab.core.interfaces import EngineLimits
    from servelab.core.request import Sequence

    snippet = next(c for c in page_code_blocks("write-a-scheduler.md") if "deadline_s =" in c)
    seq = Sequence(Request("r", (1, 2, 3), 4, ttft_slo_ms=own), arrival_s=2.0)
    limits = EngineLimits(16, 4, 64, 128, True, ttft_slo_ms=default)
    scope = {"seq": seq, "self": SimpleNamespace(limits=limits)}
    exec(compile(snippet, "write-a-scheduler.md#slo-targets", "exec"), scope)
    assert scope["ttft_ms"] == expected_ms
    assert scope["deadline_s"] == (None if expected_ms is None else 2.0 + expected_ms / 1e3)
