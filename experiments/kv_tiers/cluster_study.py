"""KV tiers on a cluster (issue 38): four 70B replicas, each with its own host tier or all sharing one
(Mooncake-style store, ``kv_tiers.tiers.0.shared=true``) of the same total size, under the
``round_robin`` and ``prefix_affinity`` routers.

    python experiments/kv_tiers/cluster_study.py --update-readme   # experiments/kv_tiers/cluster.md, cluster_results.json
    python experiments/kv_tiers/cluster_study.py                   # the same, under multirun/kv_tiers_cluster/

Every run is the simulator (virtual clock): llama3_70b, TP 4 on H100, ``cluster.replicas=4``,
``workload=chat_sessions``, prefix caching on, a GPU pool far below the chats' working set,
``kv_tier_policy=write_back``. The shared tier is priced over the network (docs/kv-tiers.md): its
link is the slower of the host tier's 25 GB/s and H100's 50 GB/s NIC, latency 10 + 20 us.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent

REPLICAS = 4
BASE = ["backend=sim", "model=llama3_70b", "tensor_parallel_size=4", "hardware=h100", "workload=chat_sessions",
        "logger=none", "progress=false", "allocator.prefix_caching=true", f"cluster.replicas={REPLICAS}"]
HOST_GIB = 2.0  # each replica's own host tier; the shared one is REPLICAS x this (equal host memory)
TIERS = {
    "GPU only": [],
    f"own host {HOST_GIB:g} GiB each": ["kv_tiers=host", "kv_tier_policy=write_back",
                                         f"kv_tiers.tiers.0.capacity_gib={HOST_GIB}"],
    f"one shared host {REPLICAS * HOST_GIB:g} GiB": ["kv_tiers=host", "kv_tier_policy=write_back",
                                                     f"kv_tiers.tiers.0.capacity_gib={REPLICAS * HOST_GIB}",
                                                     "kv_tiers.tiers.0.shared=true"],
}
ROUTERS = ("round_robin", "prefix_affinity")


def _run(overrides: list[str]) -> dict:
    from servelab.api import compose
    from servelab.run.session import run_job

    with tempfile.TemporaryDirectory() as out:
        return run_job(compose(BASE + overrides), out).summary


def _row(router: str, tiers: str, s: dict) -> dict:
    return {"router": router, "tiers": tiers, "gpu_hit": s["prefix_cache_hit_rate"],
            "tier_hit": s.get("kv_tier_hit_rate"),
            "replica_tier_hit": [p.get("kv_tier_hit_rate") for p in s["per_replica"]],
            "prefill_tokens": s["prefill_tokens_computed"], "ttft_p50_ms": s["ttft_ms"]["p50"],
            "ttft_p99_ms": s["ttft_ms"]["p99"], "output_tok_s": s["output_throughput_tok_s"],
            "read_gb": sum(t["read_bytes"] for t in s.get("kv_tiers", [])) / 1e9,
            "load_added_s": s.get("kv_tier_load_added_s", 0.0), "load_imbalance": s["load_imbalance"]}


def study(sessions: int, num_kv_blocks: int) -> dict:
    work = [f"workload.num_sessions={sessions}", f"num_kv_blocks={num_kv_blocks}"]
    rows = [_row(router, label, _run(work + [f"router={router}"] + tiers))
            for router in ROUTERS for label, tiers in TIERS.items()]
    return {"sessions": sessions, "num_kv_blocks": num_kv_blocks, "rows": rows}


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _table(rows: list[dict]) -> str:
    lines = ["| router | tiers | GPU hit | tier hit | tier hit per replica | prefill tokens | TTFT p50 ms | "
             "TTFT p99 ms | output tok/s | GB loaded | load added s | load imbalance |\n|" + "---|" * 12]
    for r in rows:
        per = " / ".join(_pct(x) for x in r["replica_tier_hit"]) if r["tier_hit"] is not None else "-"
        lines.append(f"| {r['router']} | {r['tiers']} | {_pct(r['gpu_hit'])} | {_pct(r['tier_hit'])} | {per} | "
                     f"{r['prefill_tokens']:,} | {r['ttft_p50_ms']:.1f} | {r['ttft_p99_ms']:.1f} | "
                     f"{r['output_tok_s']:.1f} | {r['read_gb']:.2f} | {r['load_added_s']:.3f} | "
                     f"{r['load_imbalance']:.2f} |")
    return "\n".join(lines)


def findings(res: dict) -> list[str]:
    by = {(r["router"], r["tiers"]): r for r in res["rows"]}
    gpu_l, own_l, shared_l = TIERS
    out = []
    for router in ROUTERS:
        gpu, own, shared = by[(router, gpu_l)], by[(router, own_l)], by[(router, shared_l)]
        out.append(f"`{router}`: GPU only computes {gpu['prefill_tokens']:,} prefill tokens; per-replica host tiers "
                   f"load {_pct(own['tier_hit'])} of the GPU's misses ({own['prefill_tokens']:,} tokens), one shared "
                   f"tier of the same total size {_pct(shared['tier_hit'])} ({shared['prefill_tokens']:,}); TTFT p99 "
                   f"{gpu['ttft_p99_ms']:.1f} / {own['ttft_p99_ms']:.1f} / {shared['ttft_p99_ms']:.1f} ms.")
    rr_gain = 1 - by[("round_robin", shared_l)]["prefill_tokens"] / by[("round_robin", own_l)]["prefill_tokens"]
    pa_gain = 1 - by[("prefix_affinity", shared_l)]["prefill_tokens"] / by[("prefix_affinity", own_l)]["prefill_tokens"]
    out.append(f"Sharing the tier cuts prefill tokens by {100 * rr_gain:.1f}% under round_robin (a conversation's "
               f"turns land on different replicas, so only a shared store finds the last turn's KV) and by "
               f"{100 * pa_gain:.1f}% under prefix_affinity (turns already return to the replica that holds them).")
    best = min(res["rows"], key=lambda r: r["prefill_tokens"])
    out.append(f"Fewest prefill tokens: `{best['router']}` with {best['tiers']} ({best['prefill_tokens']:,}); "
               f"prefix_affinity with GPU only computes {by[('prefix_affinity', gpu_l)]['prefill_tokens']:,}, "
               f"round_robin with a shared tier {by[('round_robin', shared_l)]['prefill_tokens']:,}.")
    return out


def page(res: dict, wall_s: float, command: str) -> str:
    return "\n".join([
        "# KV tiers on a cluster: per-replica host tiers against one shared store (issue 38)", "",
        f"Four llama3_70b replicas (TP 4, H100, simulator) serve `chat_sessions` ({res['sessions']} sessions), each "
        f"with a `num_kv_blocks={res['num_kv_blocks']}` GPU pool, prefix caching on, `kv_tier_policy=write_back`. "
        f"Tiers: none; a {HOST_GIB:g} GiB host tier per replica; or one {REPLICAS * HOST_GIB:g} GiB host tier shared "
        "by all four (`kv_tiers.tiers.0.shared=true`, a Mooncake-style store, priced over the network: "
        "[docs/kv-tiers.md](../../docs/kv-tiers.md#a-tier-shared-by-a-cluster)). Equal host memory either way. "
        "Tier hit rates are of the prompt blocks the GPU prefix cache missed.", "",
        f"Command: `{command}`. Made {datetime.now():%Y-%m-%d %H:%M} on {platform.node()} "
        f"(Python {platform.python_version()}) in {wall_s:.0f} s wall; every time below is engine time on the "
        "virtual clock.", "",
        "## Findings", "", *[f"- {f}" for f in findings(res)], "",
        "## Runs", "", _table(res["rows"]), "",
        "Not studied here: a shared disk tier, the Mooncake trace on a cluster, prefill/decode pools with tiers "
        "(refused: tiers beside a prefill/decode hand-off are not built).", "",
    ])


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--update-readme", action="store_true",
                        help="write experiments/kv_tiers/{cluster.md,cluster_results.json}")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(REPO))
    import logging

    logging.disable(logging.WARNING)
    start = time.time()
    res = study(160, 800)
    wall = time.time() - start
    out = HERE if args.update_readme else REPO / "multirun" / "kv_tiers_cluster" / f"{datetime.now():%Y-%m-%d_%H-%M-%S}"
    out.mkdir(parents=True, exist_ok=True)
    (out / "cluster_results.json").write_text(json.dumps(res, indent=1) + "\n")
    command = "python experiments/kv_tiers/cluster_study.py" + (" --update-readme" if args.update_readme else "")
    (out / "cluster.md").write_text(page(res, wall, command))
    print(f"wrote {out / 'cluster.md'} ({wall:.0f} s)")


if __name__ == "__main__":
    main()
