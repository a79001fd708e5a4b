"""What ``summary.json`` states about the KV tiers below the GPU (docs/metrics.md, "KV tiers").

Per tier (``kv_tiers`` in the summary, nearest first) and flattened for ``servelab compare``
(``kv_tier_<kind>_<figure>``, the first tier of a kind): the hit rate (prompt blocks loaded from
the tier over the prompt blocks of new requests that the GPU prefix cache missed), the bytes read
from it to the GPU and written into it (from the GPU, or demoted from the tier above), the blocks
it dropped and the most it held; and for all tiers the step time loads added and the load time
hidden behind compute.
"""

from __future__ import annotations

from typing import Any

from servelab.kv.connectors import find_part
from servelab.kv.tiers.store import TieredKVConnector


def ttft_split(summary: dict, connector: Any) -> dict | None:
    """``kv_tier_ttft_split_ms``: mean TTFT as queueing (arrival to first scheduled), tier load (the
    step time a request's own load added to its first step: the added time of a step shared among its
    loaders by link time), and prefill with everything else (the rest). Means over requests with a
    first token (None without them). On the wall clock (a real engine) the copies run inside the steps
    and are not priced apart: the load part is 0 there."""
    ttft, queue = summary.get("ttft_ms") or {}, summary.get("queue_ms") or {}
    n = summary.get("num_finished") or 0
    connector = find_part(connector, TieredKVConnector)
    if not isinstance(connector, TieredKVConnector) or ttft.get("mean") is None or queue.get("mean") is None or not n:
        return None
    load = 1e3 * sum(connector.added_s_by_request.values()) / n
    return {"queueing": queue["mean"], "load": load, "prefill_and_rest": ttft["mean"] - queue["mean"] - load}


def kv_tier_figures(connector: Any) -> dict:
    """The figures of ``connector`` when it is (or composes) the tiered store; ``{}`` otherwise (no
    tiers: no keys)."""
    connector = find_part(connector, TieredKVConnector)
    if not isinstance(connector, TieredKVConnector):
        return {}
    store, per_block = connector, connector.bytes_per_block
    lookups = store.lookup_blocks
    tiers = []
    for i, spec in enumerate(store.tiers):
        tiers.append({
            "kind": spec.kind, "capacity_blocks": spec.num_blocks,
            "hit_rate": store.hit_blocks[i] / lookups if lookups else 0.0,
            "hit_blocks": store.hit_blocks[i],
            "read_bytes": (store.hit_blocks[i] + store.reload_blocks[i]) * per_block,
            "written_bytes": store.written_blocks[i] * per_block,
            "dropped_blocks": store.dropped_blocks[i],
            "max_held_blocks": store.max_held[i],
        })
    loads = list(store.load_s_by_request.values())
    out: dict = {
        "kv_tiers": tiers,
        "kv_tier_policy": store.policy.name if store.policy is not None else None,
        "kv_tier_lookup_blocks": lookups,
        "kv_tier_hit_rate": sum(store.hit_blocks) / lookups if lookups else 0.0,
        "kv_tier_requests_loaded": store.loads,
        "kv_tier_requests_reloaded": store.reloads,
        "kv_tier_load_s_per_loaded_request_mean": sum(loads) / len(loads) if loads else 0.0,
        "kv_tier_load_added_s": store.load_added_s,
        "kv_tier_load_hidden_s": store.load_hidden_s,
        "kv_tier_books_broken": store.leaked(),
        "kv_tier_prefetch_blocks": store.prefetched_blocks,
        "kv_tier_prefetch_used_blocks": store.prefetch_used_blocks,
        "kv_tier_prefetch_wasted_blocks": store.prefetched_blocks - store.prefetch_used_blocks,
        "kv_tier_prefetch_link_s": store.prefetch_link_s,
    }
    if store.host_memory is not None:  # one host memory with the swap pool
        out["kv_tier_host_memory"] = store.host_memory.figures()
    for tier in reversed(tiers):  # the first tier of a kind wins
        for key in ("hit_rate", "read_bytes", "written_bytes", "dropped_blocks"):
            out[f"kv_tier_{tier['kind']}_{key}"] = tier[key]
    return out
