"""The policy of docs/write-a-kv-tier-policy.md registers, composes as ``kv_tier_policy=keep_roots``,
validates its key, keeps roots a full tier holds, and passes the conformance kit."""

from collections import OrderedDict

import pytest

from conftest import compose
from doc_plugins import page_code_blocks, register_page_plugin
from servelab.core.contexts import KVTierPolicyContext
from servelab.core.errors import ConfigError
from servelab.core.kv_tiers import TierBlock
from servelab.assemble.stack import build_stack

PAGE = "write-a-kv-tier-policy.md"
SIM = ("backend=sim", "model=tiny_code", "kv_tiers=host", "logger=none")


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    code = next(c for c in page_code_blocks(PAGE) if c.startswith("# servelab_keep_roots.py"))  # the example
    return register_page_plugin(code, tmp_path_factory.mktemp("doc_plugin"), "servelab_keep_roots")


def test_the_pages_policy_gives_up_deep_blocks_first(registry):
    cls = registry.get("kv_tier_policy", "keep_roots")
    policy = cls(cls.Config(roots=2), KVTierPolicyContext())
    blocks = OrderedDict((bytes([i]), TierBlock(bytes([i]), p)) for i, p in enumerate([0, 1, 5, 3]))
    assert policy.victim(0, blocks) == bytes([2])  # the oldest block past the roots
    roots_only = OrderedDict(list(blocks.items())[:2])
    assert policy.victim(0, roots_only) == bytes([0])


def test_the_pages_policy_validates_its_key(registry):
    with pytest.raises(ConfigError, match="kv_tier_policy.roots=-1"):
        build_stack(compose(*SIM, "kv_tier_policy=keep_roots", "kv_tier_policy.roots=-1"), registry)


def test_the_pages_policy_passes_the_conformance_kit(registry):
    from servelab.testing import check_plugin

    report = check_plugin("kv_tier_policy", "keep_roots", registry=registry, cases=2)
    assert report.ok, str(report)


def test_the_pages_policy_prefetches_only_from_the_host_and_up_to_its_cap(registry):
    cls = registry.get("kv_tier_policy", "keep_roots")
    policy = cls(cls.Config(max_staged=2), KVTierPolicyContext())
    block = TierBlock(b"x", 3)
    assert policy.prefetch(0, block, 1) and not policy.prefetch(0, block, 2) and not policy.prefetch(1, block, 0)


def test_the_pages_view_reading_policy_runs_and_stores(tmp_path):
    """The "What a policy can read" snippet, registered, runs a chat over the tiers and loads from them."""
    from servelab.run.session import run_job

    code = next(c for c in page_code_blocks(PAGE) if "class HostWhileRoom" in c)
    code += "\n\n@hookimpl\ndef servelab_register_kv_tier_policies():\n    return [HostWhileRoom]\n"
    registry = register_page_plugin("from servelab.plugin_api import hookimpl\n" + code, tmp_path, "host_while_room")
    cfg = compose("backend=sim", "model=llama3_70b", "tensor_parallel_size=4", "workload=chat_sessions",
                  "workload.num_sessions=12", "num_kv_blocks=600", "logger=none", "kv_tiers=host",
                  "kv_tiers.tiers.0.capacity_gib=0.25", "kv_tier_policy=host_while_room")
    summary = run_job(cfg, tmp_path / "run", stack=build_stack(cfg, registry)).summary
    host, = summary["kv_tiers"]
    assert host["written_bytes"] > 0 and host["hit_blocks"] > 0 and summary["kv_tier_books_broken"] == 0
