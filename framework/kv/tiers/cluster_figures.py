"""The KV tier figures of a cluster's ``summary.json``, from its replicas' reports (docs/metrics.md,
"KV tiers"; docs/cluster.md).

Each replica reports its own store's figures (:func:`replica_tier_report`, plain data, so an engine
process can send it too); :func:`cluster_tier_figures` merges them into the keys a single engine's
summary has: counts, bytes and seconds summed over the replicas, rates recomputed from the sums.
A shared tier (``kv_tiers.tiers.<i>.shared``, one store for the cluster) is counted once: its
``capacity_blocks`` is the store's and its ``max_held_blocks`` the most any replica saw it hold;
a per-replica tier's capacity and ``max_held_blocks`` are the replicas' summed. Every tier entry
says whether it is ``shared``. Each ``per_replica`` entry gets its own ``kv_tier_hit_rate``.
"""

from __future__ import annotations

from typing import Any

from servelab.kv.connectors import find_part
from servelab.kv.tiers.figures import kv_tier_figures
from servelab.kv.tiers.store import TieredKVConnector

SUMMED = ("hit_blocks", "read_bytes", "written_bytes", "dropped_blocks")
PREFETCH_SUMS = ("kv_tier_prefetch_blocks", "kv_tier_prefetch_used_blocks", "kv_tier_prefetch_wasted_blocks",
                 "kv_tier_prefetch_link_s")  # summed over the replicas
FLAT = ("hit_rate", "read_bytes", "written_bytes", "dropped_blocks")


def replica_tier_report(connector: Any) -> dict:
    """One replica's tier figures (``{}``: it has no tiered store), with what the cluster's merge
    needs beside them: which tiers are shared and the load time its requests' TTFT took."""
    figures = kv_tier_figures(connector)
    if not figures:
        return {}
    connector = find_part(connector, TieredKVConnector)
    assert isinstance(connector, TieredKVConnector)
    figures["shared"] = [t.shared for t in connector.tiers]
    figures["ttft_load_s"] = sum(connector.added_s_by_request.values())
    return figures


def cluster_tier_figures(reports: list[dict], num_finished: int, ttft: dict, queue: dict) -> dict:
    """The cluster's tier keys of ``summary.json`` from every replica's :func:`replica_tier_report`
    (``{}`` when no replica has tiers); ``ttft`` / ``queue``: the cluster's ``ttft_ms`` / ``queue_ms``."""
    parts = [r for r in reports if r]
    if not parts:
        return {}
    first = parts[0]
    lookups = sum(p["kv_tier_lookup_blocks"] for p in parts)
    tiers = []
    for i, tier in enumerate(first["kv_tiers"]):
        shared = first["shared"][i]
        level = [p["kv_tiers"][i] for p in parts]
        merged = {"kind": tier["kind"], "shared": shared,
                  "capacity_blocks": tier["capacity_blocks"] if shared else sum(t["capacity_blocks"] for t in level),
                  **{k: sum(t[k] for t in level) for k in SUMMED},
                  "max_held_blocks": (max if shared else sum)(t["max_held_blocks"] for t in level)}
        merged["hit_rate"] = merged["hit_blocks"] / lookups if lookups else 0.0
        tiers.append(merged)
    loaded = sum(p["kv_tier_requests_loaded"] for p in parts)
    load_s = sum(p["kv_tier_load_s_per_loaded_request_mean"] * p["kv_tier_requests_loaded"] for p in parts)
    out: dict = {
        "kv_tiers": tiers,
        "kv_tier_policy": first["kv_tier_policy"],
        "kv_tier_lookup_blocks": lookups,
        "kv_tier_hit_rate": sum(t["hit_blocks"] for t in tiers) / lookups if lookups else 0.0,
        "kv_tier_requests_loaded": loaded,
        "kv_tier_requests_reloaded": sum(p["kv_tier_requests_reloaded"] for p in parts),
        "kv_tier_load_s_per_loaded_request_mean": load_s / loaded if loaded else 0.0,
        "kv_tier_load_added_s": sum(p["kv_tier_load_added_s"] for p in parts),
        "kv_tier_load_hidden_s": sum(p["kv_tier_load_hidden_s"] for p in parts),
        "kv_tier_books_broken": sum(p["kv_tier_books_broken"] for p in parts),
        **{key: sum(p[key] for p in parts) for key in PREFETCH_SUMS},
    }
    for tier in reversed(tiers):  # the first tier of a kind wins, as on one engine
        for key in FLAT:
            out[f"kv_tier_{tier['kind']}_{key}"] = tier[key]
    if num_finished and ttft.get("mean") is not None and queue.get("mean") is not None:
        load = 1e3 * sum(p["ttft_load_s"] for p in parts) / num_finished
        out["kv_tier_ttft_split_ms"] = {"queueing": queue["mean"], "load": load,
                                        "prefill_and_rest": ttft["mean"] - queue["mean"] - load}
    else:
        out["kv_tier_ttft_split_ms"] = None
    return out


def replica_tier_hit_rate(report: dict) -> dict:
    """``kv_tier_hit_rate`` of one ``per_replica`` entry (``{}``: the replica has no tiers)."""
    return {"kv_tier_hit_rate": report["kv_tier_hit_rate"]} if report else {}
