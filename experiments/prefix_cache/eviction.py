"""Prefix-cache eviction (``evictor=lru|lfu|arc|cost_aware``): hit rate and throughput against the
KV pool's size, from "everything fits" down to where the cache thrashes.

    python experiments/prefix_cache/eviction.py                    # multirun/prefix_cache/<time>/eviction/
    python experiments/prefix_cache/eviction.py --update-readme    # experiments/prefix_cache/eviction/ + README

1. Simulator, 70B: Llama-3-70B on 8 simulated H100s (``time_model=auto``, virtual clock), prefix
   caching on, two workloads: the Mooncake conversation trace (``workload=hash_ids``, the first
   ``--mooncake-requests`` rows with every length x1/4: 128 tokens per 512-token trace block, and
   arrival times x1/4, so prompt tokens arrive at the trace's own rate) and a synthetic multi-turn chat over shared
   system prompts (``workload=chat_sessions``). The pool (``num_kv_blocks``) is swept as a
   fraction of the workload's working set (the KV blocks of every distinct prefix block); the
   ceiling is the infinite-memory ideal (every earlier request's full blocks cached).
2. Real model: the random-weight tiny model of the prefix-caching tables on this CPU (virtual
   clock, small64 profile), the Mooncake trace at 8 tokens per trace block through a pool that
   thrashes: every evictor's output tokens must equal lru's, request by request.

Everything is on the virtual clock: the same numbers on any machine.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (
    REAL_TINY, SIM_70B, finish, ideal_hit_tokens, lat, machine_line, mean_p, parse_args, plt, quiet, real_runs, run,
    save_figure, table, time_model_note, write_csv, write_json,
)

NAME = "eviction"
EVICTORS = ("lru", "lfu", "arc", "cost_aware")


def add_arguments(p) -> None:
    p.add_argument("--evictors", nargs="+", default=list(EVICTORS))
    p.add_argument("--fractions", type=float, nargs="+", default=[1.0, 0.3, 0.1, 0.03, 0.015],
                   help="KV pool sizes as fractions of the workload's working set")
    p.add_argument("--mooncake-requests", type=int, default=800)
    p.add_argument("--mooncake-block-tokens", type=int, default=128,
                   help="tokens per 512-token trace block (lengths x block_tokens / 512)")
    p.add_argument("--mooncake-time-scale", type=float, default=0.25,
                   help="arrival times x this (0.25 with 128-token blocks: the trace's own token rate)")
    p.add_argument("--chat-sessions", type=int, default=600)
    p.add_argument("--chat-session-rate", type=float, default=2.0)
    p.add_argument("--seats", type=int, default=128, help="max_num_seqs in the simulator")
    p.add_argument("--real-requests", type=int, default=160)
    p.add_argument("--real-blocks", type=int, default=400, help="num_kv_blocks of the real-model runs")
    p.add_argument("--seed", type=int, default=0)


BLOCK = 16  # the simulator's block size (the default)


def workloads(args) -> dict[str, dict]:
    """name -> {overrides, requests} of the simulator's two workloads (built once, reused by every run)."""
    from omegaconf import OmegaConf

    from servelab.config import ChatSessionsWorkload, HashIdsWorkload
    from servelab.workloads.build import build_requests

    mooncake = OmegaConf.structured(HashIdsWorkload(num_requests=args.mooncake_requests, block_tokens=args.mooncake_block_tokens,
                                                    seed=args.seed, time_scale=args.mooncake_time_scale))
    chat = OmegaConf.structured(ChatSessionsWorkload(num_sessions=args.chat_sessions,
                                                     session_rate=args.chat_session_rate, seed=args.seed))
    out = {}
    for name, cfg, label in (("mooncake", mooncake, f"Mooncake conversation trace, first {args.mooncake_requests} rows"),
                             ("chat", chat, f"chat_sessions, {args.chat_sessions} sessions")):
        requests = build_requests(cfg, 128256, 16384)
        out[name] = {"label": label, "requests": requests, "time_scale": cfg.time_scale,
                     "working_set_blocks": working_set_blocks(requests, BLOCK),
                     "ideal_hit_tokens": ideal_hit_tokens(requests, BLOCK),
                     "prompt_tokens": sum(r.prompt_len for r in requests)}
    return out


def working_set_blocks(requests, block_size: int) -> int:
    """Distinct full prompt blocks (by chained digest) plus each request's partial and output blocks:
    what a pool holding every prefix ever seen, and one request's tail at a time, needs."""
    from servelab.plugins.allocators.paged import block_digest

    seen = set()
    for r in requests:
        parent = b""
        for j in range(r.prompt_len // block_size):
            parent = block_digest(parent, r.prompt_token_ids[j * block_size:(j + 1) * block_size])
            seen.add(parent)
    return len(seen) + sum(-(-(r.prompt_len % block_size + r.max_tokens) // block_size) for r in requests)


def figures(r, w: dict) -> dict:
    s = r.summary
    ttft = lat(r.records, "ttft_ms")
    return {"hit_rate": s["prefix_cache_hit_rate"], "ideal_hit_rate": w["ideal_hit_tokens"] / w["prompt_tokens"],
            "output_tok_s": s["output_throughput_tok_s"], "prefill_tokens_computed": s["prefill_tokens_computed"],
            "ttft_p50_ms": mean_p(ttft, 50), "ttft_p99_ms": mean_p(ttft, 99), "duration_s": s["duration_s"],
            "preemptions": s["num_preemptions"]}


def main(argv=None) -> dict:
    args = parse_args(__doc__, NAME, add_arguments, argv)
    quiet()
    t_start = time.perf_counter()
    base = SIM_70B + [f"max_num_seqs={args.seats}", "allocator.prefix_caching=true", f"block_size={BLOCK}"]
    sim: dict = {}
    time_model = None
    for wname, w in workloads(args).items():
        print(f"eviction, simulator: {w['label']} (working set {w['working_set_blocks']} blocks)", flush=True)
        rows = []
        for fraction in args.fractions:
            blocks = max(int(w["working_set_blocks"] * fraction), 16384 // BLOCK + 1)
            for evictor in args.evictors:
                r = run(f"{wname} pool {fraction:g} {evictor}",
                        base + [f"num_kv_blocks={blocks}", f"evictor={evictor}",
                                f"workload.time_scale={w['time_scale']}"], w["requests"])
                time_model = time_model or r.time_model
                rows.append({"fraction": fraction, "num_kv_blocks": blocks, "evictor": evictor, **figures(r, w)})
        sim[wname] = {"label": w["label"], "working_set_blocks": w["working_set_blocks"],
                      "num_requests": len(w["requests"]), "prompt_tokens": w["prompt_tokens"],
                      "ideal_hit_rate": w["ideal_hit_tokens"] / w["prompt_tokens"], "rows": rows}
    real = real_part(args)
    total = time.perf_counter() - t_start
    out = args.out_dir
    plot(sim, args, out)
    results = {"settings": {k: v for k, v in vars(args).items() if k != "out_dir"}, "overrides": base,
               "time_model": time_model, "sim": sim, "real": real, "total_wall_s": round(total, 1),
               "date": time.strftime("%Y-%m-%d %H:%M")}
    write_json(out / "results.json", results)
    keys = ["hit_rate", "ideal_hit_rate", "output_tok_s", "ttft_p50_ms", "ttft_p99_ms", "duration_s", "preemptions"]
    write_csv(out / "results.csv", ["workload", "fraction", "num_kv_blocks", "evictor"] + keys,
              [[w, row["fraction"], row["num_kv_blocks"], row["evictor"]] + [row[k] for k in keys]
               for w, d in sim.items() for row in d["rows"]])
    finish(args, NAME, page(args, results, total), headline(results))
    return results


def real_part(args) -> dict:
    """Every evictor on the real tiny model through a small pool: tokens equal to lru's."""
    print("eviction, real tiny model on the CPU (virtual clock)", flush=True)
    overrides = REAL_TINY + ["workload=hash_ids", f"workload.num_requests={args.real_requests}",
                             "workload.block_tokens=16", "block_size=16", "allocator.prefix_caching=true",
                             f"num_kv_blocks={args.real_blocks}", "workload.time_scale=0.02", "max_model_len=2048"]
    tokens, summaries = real_runs(overrides, {e: [f"evictor={e}"] for e in args.evictors}, NAME)
    rows = {e: {"hit_rate": s["prefix_cache_hit_rate"], "output_tok_s": s["output_throughput_tok_s"],
                "duration_s": s["duration_s"], "leaked_blocks": s["leaked_blocks"],
                "tokens_equal_to_lru": tokens[e] == tokens["lru"]} for e, s in summaries.items()}
    return {"overrides": overrides, "rows": rows}


def plot(sim: dict, args, out: Path) -> None:
    fig, axes = plt.subplots(3, len(sim), figsize=(6 * len(sim), 10), squeeze=False)
    for col, (wname, d) in enumerate(sim.items()):
        for evictor in args.evictors:
            pts = sorted((r["fraction"], r) for r in d["rows"] if r["evictor"] == evictor)
            xs = [f for f, _ in pts]
            axes[0][col].plot(xs, [r["hit_rate"] for _, r in pts], "o-", label=evictor)
            axes[1][col].plot(xs, [r["output_tok_s"] for _, r in pts], "o-", label=evictor)
            axes[2][col].plot(xs, [r["ttft_p99_ms"] / 1e3 for _, r in pts], "o-", label=evictor)
        axes[0][col].axhline(d["ideal_hit_rate"], color="grey", ls="--", label="infinite-memory ideal")
        axes[0][col].set(xscale="log", xlabel="KV pool / working set", ylabel="prefix hit rate", title=d["label"])
        axes[1][col].set(xscale="log", xlabel="KV pool / working set", ylabel="output tokens/s (engine time)")
        axes[1][col].set_ylim(bottom=0)  # an arrival-bound workload's throughput is flat: show it flat
        axes[2][col].set(xscale="log", yscale="log", xlabel="KV pool / working set", ylabel="TTFT p99 (s)")
        for ax in axes[:, col]:
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
    save_figure(fig, out / "eviction.png")


def best_by_pool(rows) -> list[tuple[float, str, float, float]]:
    """(fraction, winning evictor, its hit rate, lru's) per pool size."""
    out = []
    for fraction in sorted({r["fraction"] for r in rows}, reverse=True):
        at = [r for r in rows if r["fraction"] == fraction]
        best = max(at, key=lambda r: (r["hit_rate"], r["output_tok_s"]))
        lru = next((r for r in at if r["evictor"] == "lru"), best)
        out.append((fraction, best["evictor"], best["hit_rate"], lru["hit_rate"]))
    return out


def findings(sim: dict) -> list[str]:
    """Generated: per workload, the spread between evictors at each pool size, and who led where."""
    out = []
    for d in sim.values():
        spread = []
        for fraction in sorted({r["fraction"] for r in d["rows"]}, reverse=True):
            at = sorted((r for r in d["rows"] if r["fraction"] == fraction), key=lambda r: -r["hit_rate"])
            gap = (at[0]["hit_rate"] - at[-1]["hit_rate"]) * 100
            spread.append(f"{fraction:g}x: {gap:.1f} points" + (f" ({at[0]['evictor']} first, {at[-1]['evictor']} last)"
                                                               if gap >= 0.05 else ""))
        out.append(f"- **{d['label']}**: the spread between the best and the worst evictor's hit rate, by pool: "
                   + "; ".join(spread) + f". The ideal is {d['ideal_hit_rate']:.1%}.")
    out.append("- With room for the whole working set no block is evicted and all four are equal (the conformance kit's "
               "'hits kept' contract). In between, which evictor wins depends on the traffic; at the smallest pools "
               "the running requests' own blocks fill the pool, little stays cached whatever the policy, and the "
               "differences shrink again. No evictor changed a token on the real model.")
    return out


def headline(res: dict) -> str:
    parts = []
    for wname, d in res["sim"].items():
        ranked = best_by_pool(d["rows"])
        f, e, h, h_lru = max(ranked, key=lambda t: t[2] - t[3])  # where the choice of evictor mattered most
        parts.append(f"{d['label']}: at {f:g}x the working set {e} keeps {h:.1%} of prompt tokens cached vs lru's "
                     f"{h_lru:.1%} (ideal {d['ideal_hit_rate']:.1%})")
    same = all(r["tokens_equal_to_lru"] for r in res["real"]["rows"].values())
    return "; ".join(parts) + f"; tokens on the real model {'equal to lru for every evictor' if same else 'DIFFER'}."


def page(args, res: dict, total_wall: float) -> str:
    sim, real = res["sim"], res["real"]
    lines = [
        "## Eviction: which cached prefix block to give up",
        "",
        "**Question.** The paged allocator's prefix cache keeps every computed full block until the pool needs "
        "room; then something must go. vLLM and SGLang evict least recently used; proposals for LFU, ARC and "
        "cost-aware eviction exist without data. Here each is a plugin (`evictor=lru|lfu|arc|cost_aware`, "
        "[docs/policies.md](../../docs/policies.md)) and the same runs differ only in it.",
        "",
        f"**Setup.** Simulator (`backend=sim`), llama3_70b, TP 8 on H100, {time_model_note(res['time_model'], 'sim')}, "
        f"virtual clock; `max_num_seqs={args.seats}`, `block_size={BLOCK}`, chunked prefill (2,048-token steps), "
        "recompute preemption, `allocator.prefix_caching=true`. The pool (`num_kv_blocks`) is swept as a fraction of "
        "each workload's working set (the KV blocks of every distinct full prompt block, plus each request's own "
        "tail); it never goes below one 16,384-token request. The ceiling is the infinite-memory ideal (each prompt "
        "reuses its longest run of leading full blocks seen in any earlier request).",
        "",
        f"Command: `python experiments/prefix_cache/eviction.py --update-readme`. {machine_line(total_wall)}",
        "",
    ]
    for wname, d in sim.items():
        lines += [f"### {d['label']}", "",
                  f"{d['num_requests']} requests, {d['prompt_tokens']:,} prompt tokens, working set "
                  f"{d['working_set_blocks']:,} blocks; ideal hit rate {d['ideal_hit_rate']:.1%}.", ""]
        lines.append(table(["pool / working set", "num_kv_blocks", "evictor", "hit rate", "output tok/s",
                            "TTFT p50 s", "TTFT p99 s", "duration s", "preemptions"],
                           [[r["fraction"], r["num_kv_blocks"], r["evictor"], f"{r['hit_rate']:.2%}", r["output_tok_s"],
                             r["ttft_p50_ms"] / 1e3, r["ttft_p99_ms"] / 1e3, r["duration_s"], r["preemptions"]]
                            for r in d["rows"]]))
        lines.append("")
        lines += [f"- at {f:g}x: **{e}** {h:.2%} (lru {h_lru:.2%})" if h - h_lru >= 5e-4 else
                  f"- at {f:g}x: a tie, every evictor within 0.05 points of lru's {h_lru:.2%}"
                  for f, e, h, h_lru in best_by_pool(d["rows"])]
        lines.append("")
    lines += ["### What it shows", "", *findings(sim), "", "![eviction](eviction/eviction.png)", "",
              "### Real model: tokens", "",
              f"The tiny random-weight model on this CPU (`{' '.join(real['overrides'])}`): a pool of "
              f"{args.real_blocks} blocks, so blocks are evicted throughout; what is checked here is that no "
              "evictor changes a token (the hit rates may tie at this size).", "",
              table(["evictor", "hit rate", "output tok/s", "tokens equal to lru's", "leaked blocks"],
                    [[k, f"{v['hit_rate']:.2%}", v["output_tok_s"], v["tokens_equal_to_lru"], v["leaked_blocks"]]
                     for k, v in real["rows"].items()]), ""]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
