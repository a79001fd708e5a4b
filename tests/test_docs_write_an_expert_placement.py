"""The placement of docs/write-an-expert-placement.md registers, composes as ``expert_placement=hot_spread``,
deals the hottest experts to different ranks, and passes the conformance kit."""

import numpy as np
import pytest

from doc_plugins import page_code_blocks, register_page_plugin
from servelab.core.expert_placement import ExpertPlacementContext

PAGE = "write-an-expert-placement.md"


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    code = next(c for c in page_code_blocks(PAGE) if c.startswith("# servelab_hot_spread.py"))  # the example
    return register_page_plugin(code, tmp_path_factory.mktemp("doc_plugin"), "servelab_hot_spread")


def test_the_pages_placement_spreads_the_hottest_experts(registry):
    cls = registry.get("expert_placement", "hot_spread")
    plugin = cls(cls.Config(), ExpertPlacementContext(8, 1, 4, 2))
    plan = plugin.place(np.array([[1.0, 9, 2, 8, 3, 7, 4, 6]]))
    assert plugin.replan_every_steps == 500
    assert plan[0, :, 0].tolist() == [1, 3, 5, 7]  # the four hottest, one per rank


def test_the_pages_placement_passes_the_conformance_kit(registry):
    from servelab.testing import check_plugin

    report = check_plugin("expert_placement", "hot_spread", registry=registry, cases=2)
    assert report.ok, str(report)
