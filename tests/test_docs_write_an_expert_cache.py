"""The cache of docs/write-an-expert-cache.md registers, composes as ``expert_cache=sticky_lfu``, keeps a
resident expert over a slightly hotter streamed-in one, and passes the conformance kit."""

import numpy as np
import pytest

from doc_plugins import page_code_blocks, register_page_plugin
from servelab.core.expert_cache import ExpertCacheContext

PAGE = "write-an-expert-cache.md"


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    code = next(c for c in page_code_blocks(PAGE) if c.startswith("# servelab_sticky_lfu.py"))  # the example
    return register_page_plugin(code, tmp_path_factory.mktemp("doc_plugin"), "servelab_sticky_lfu")


def test_the_pages_cache_keeps_a_resident_expert_over_a_slightly_hotter_one(registry):
    cls = registry.get("expert_cache", "sticky_lfu")
    plugin = cls(cls.Config(), ExpertCacheContext(4, 1, 1, 4, 1))
    resident = plugin.keep(plugin.start(), np.array([[[2, 0, 3, 0]]]))  # 2 x 2 (resident) beats 3
    assert resident[0, 0].tolist() == [True, False, False, False]


def test_the_pages_cache_passes_the_conformance_kit(registry):
    from servelab.testing import check_plugin

    report = check_plugin("expert_cache", "sticky_lfu", registry=registry, cases=2)
    assert report.ok, str(report)
