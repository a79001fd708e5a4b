"""The policy of docs/write-a-preemption-policy.md registers, composes as ``preemption=cheapest``,
passes the conformance kit and picks the candidate with the fewest computed tokens."""

from types import SimpleNamespace

from doc_plugins import page_code_blocks, register_page_plugin
from servelab.testing import check_plugin


def test_the_pages_policy_passes_the_kit(tmp_path):
    code = next(c for c in page_code_blocks("write-a-preemption-policy.md") if "@hookimpl" in c)
    registry = register_page_plugin(code, tmp_path, "doc_cheapest")
    report = check_plugin("preemption", "cheapest", registry=registry, cases=8)
    assert report.ok, str(report)
    cls = registry.get("preemption", "cheapest")
    policy = cls(cls.Config(), None, None, None)
    a, b, c = (SimpleNamespace(id=i, num_computed_tokens=n) for i, n in (("a", 9), ("b", 3), ("c", 3)))
    assert policy.select_victim([a, b, c]) is c  # fewest tokens; the tie goes to the less important
