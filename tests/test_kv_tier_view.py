"""A KV tier policy reads the tiers' occupancy and the GPU prefix cache's reuse counts from its
context (``context.tier_view``: servelab.core.tier_view, servelab.kv.tiers.view), live, as the store's
books and the allocator's hits say."""

from __future__ import annotations

import json
import sys

from conftest import compose
from servelab.assemble.stack import build_stack
from servelab.plugin_api import KVTierPolicy, KVTierPolicyContext, TierView, hookimpl
from servelab.run.session import run_job
from servelab.testing import registry_with

CHAT = ("backend=sim", "model=llama3_70b", "tensor_parallel_size=4", "workload=chat_sessions",
        "workload.num_sessions=24", "workload.session_rate=2.0", "workload.think_time_s=4.0", "num_kv_blocks=1200",
        "logger=none", "kv_tiers=host_disk", "kv_tiers.tiers.0.capacity_gib=0.5")


class Watching(KVTierPolicy):
    """write_back that checks, at every question, what its view says against the store's books."""

    name = "watching"
    store = None  # the run's store, set by the test
    seen: list = []

    def _check(self, block):
        view, store = self.context.tier_view, self.store
        held = [view.held(t) for t in range(len(self.tiers))]
        assert held == [len(b) for b in store.blocks] and all(h <= t.num_blocks for h, t in zip(held, self.tiers))
        assert view.tier_of(block.digest) == store.where.get(block.digest)
        self.seen.append((held, view.gpu_hits(block.digest), view.on_gpu(block.digest)))

    def store_on_evict(self, block):
        self._check(block)
        assert not self.context.tier_view.on_gpu(block.digest)  # the GPU is giving it up now
        return super().store_on_evict(block)

    def on_load(self, tier, block):
        self._check(block)
        assert self.context.tier_view.tier_of(block.digest) == tier


@hookimpl
def servelab_register_kv_tier_policies():
    return [Watching]


def test_a_policy_reads_occupancy_and_gpu_reuse_from_its_context(tmp_path):
    registry = registry_with(sys.modules[__name__])
    stack = build_stack(compose(*CHAT, "kv_tier_policy=watching"), registry)
    policy = stack.engine.connector.policy
    Watching.store, Watching.seen = stack.engine.connector, []
    summary = run_job(compose(*CHAT, "kv_tier_policy=watching"), tmp_path, stack=stack).summary
    assert summary["kv_tier_books_broken"] == 0 and sum(t["hit_blocks"] for t in summary["kv_tiers"]) > 0
    seen = Watching.seen
    assert seen and max(held[0] for held, _, _ in seen) > 0  # the tiers filled
    assert any(hits > 0 for _, hits, _ in seen)  # blocks reused on the GPU before it gave them up
    # every GPU prefix hit a request's record counts was counted by the view (a re-admission counts again)
    records = [json.loads(line) for line in (tmp_path / "requests.jsonl").open()]
    counted = sum(policy.context.tier_view.hits.values()) * summary["block_size"]
    assert counted >= sum(r["num_cached_prompt_tokens"] for r in records) > 0


def test_without_a_store_the_view_is_empty():
    view = KVTierPolicyContext().tier_view
    assert type(view) is TierView and view.held(0) == 0 and view.gpu_hits(b"x") == 0
    assert view.tier_of(b"x") is None and not view.on_gpu(b"x")
