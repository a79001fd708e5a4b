"""The allocator of docs/write-an-allocator.md registers, composes as ``allocator=watermark_paged``
and passes the conformance kit, as the page says."""

from doc_plugins import page_code_blocks, register_page_plugin
from servelab.testing import check_plugin


def test_the_pages_allocator_passes_the_kit(tmp_path):
    code = next(c for c in page_code_blocks("write-an-allocator.md") if "@hookimpl" in c)
    registry = register_page_plugin(code, tmp_path, "doc_watermark_paged")
    report = check_plugin("allocator", "watermark_paged", registry=registry, cases=8)
    assert report.ok, str(report)
