"""The evictor of docs/write-an-evictor.md registers, composes as ``evictor=deepest_first``,
keeps a shared prefix that lru gives up, validates its key, passes the conformance kit, and the
page's own unit test passes."""

import sys

import pytest

from conftest import compose
from doc_plugins import page_code_blocks, register_page_plugin
from servelab.core.errors import ConfigError
from servelab.core.request import Request
from servelab.kit.testing import KVCheckingExecutor, VirtualClock
from servelab.run.runner import run_workload
from servelab.assemble.stack import build_stack

PAGE = "write-an-evictor.md"


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    code = page_code_blocks(PAGE)[1]  # the complete example
    return register_page_plugin(code, tmp_path_factory.mktemp("doc_plugin"), "deepest_first")


def _run(registry, evictor, requests, *overrides):
    cfg = compose("allocator.prefix_caching=true", f"evictor={evictor}", "block_size=4", "max_num_seqs=1",
                  "max_model_len=64", *overrides)
    clock = VirtualClock()
    stack = build_stack(cfg, registry, executor=KVCheckingExecutor(clock, 12, 4, vocab_size=1000), clock=clock)
    run_workload(stack.engine, requests, sleep=clock.sleep)
    return stack.engine.sequences


def test_the_pages_evictor_keeps_the_shared_prefix_lru_gives_up(registry):
    # One at a time through 12 blocks of 4 tokens: `a` caches S (2 blocks) + 1; the long `u1` fills
    # the rest; `u2` needs 5 blocks evicted: lru takes a's three (released first), deepest_first
    # u1's five deepest. Then `b` shares S.
    shared = tuple(range(1, 9))
    requests = [Request("a", shared + (101, 102, 103, 104), 1), Request("u1", tuple(range(200, 232)), 1),
                Request("u2", tuple(range(300, 320)), 1), Request("b", shared + (401, 402, 403, 404), 1)]
    lru = _run(registry, "lru", requests)
    deepest = _run(registry, "deepest_first", requests)
    assert lru["b"].num_cached_prompt_tokens == 0
    assert deepest["b"].num_cached_prompt_tokens == 8
    assert {r: s.output_token_ids for r, s in deepest.items()} == {r: s.output_token_ids for r, s in lru.items()}


def test_the_pages_evictor_validates_its_key(registry):
    with pytest.raises(ConfigError, match=r"^evictor=deepest_first: evictor.band=0 must be >= 1$"):
        _run(registry, "deepest_first", [], "evictor.band=0")


def test_the_pages_evictor_passes_the_conformance_kit(registry):
    from servelab.testing import check_plugin

    report = check_plugin("evictor", "deepest_first", registry=registry, cases=3, real_model=False)
    assert report.ok, str(report)


def test_the_pages_unit_test_passes(registry, monkeypatch):
    module = type(sys)("deepest_first")
    exec(page_code_blocks(PAGE)[1], module.__dict__)  # what `pip install` of the package would import
    monkeypatch.setitem(sys.modules, "deepest_first", module)
    namespace = {}
    exec(page_code_blocks(PAGE)[2], namespace)
    tests = [fn for name, fn in namespace.items() if name.startswith("test_")]
    assert len(tests) == 3
    for test in tests:
        test()
