"""KV block size: internal waste and throughput for ``block_size=8|16|32|64|auto`` on three
workloads with different length profiles.

    python experiments/prefix_cache/block_size.py                    # multirun/prefix_cache/<time>/block_size/
    python experiments/prefix_cache/block_size.py --update-readme    # experiments/prefix_cache/block_size/ + README

Simulator, 70B (Llama-3-70B, 8 simulated H100s, ``time_model=auto``, virtual clock) with the KV
pool made scarce on purpose (``backend.gpu_memory_utilization``, default 0.3: about 106k tokens of
KV), so memory lost to partly filled blocks can cost concurrency. Workloads: the Azure code trace
(long prompts, short outputs), the Azure conversation trace (shorter prompts, longer outputs), both
with arrivals compressed by ``--trace-time-scale``; short synthetic requests (median prompt 40,
output 20 tokens) through a pool of about 29k tokens with 1,024 seats; and ``chat_sessions`` with
prefix caching on (where the block is also the unit of sharing). The time model does not price a block's size, so what differs is memory only:
waste, how many requests fit, preemptions, and the prefix hits a coarser block loses.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (
    SIM_70B, finish, lat, machine_line, mean_p, parse_args, plt, quiet, run, save_figure, table, time_model_note,
    write_csv, write_json,
)

NAME = "block_size"
SIZES = ("8", "16", "32", "64", "auto")


def add_arguments(p) -> None:
    p.add_argument("--sizes", nargs="+", default=list(SIZES))
    p.add_argument("--gpu-memory-utilization", type=float, default=0.3, help="about 106k tokens of KV")
    p.add_argument("--trace-requests", type=int, default=1000)
    p.add_argument("--trace-time-scale", type=float, default=0.1)
    p.add_argument("--short-requests", type=int, default=4000)
    p.add_argument("--short-rate", type=float, default=400.0)
    p.add_argument("--short-seats", type=int, default=1024)
    p.add_argument("--short-gpu-memory-utilization", type=float, default=0.26,
                   help="the short workload's pool: about 29k tokens, so the last block's waste costs seats")
    p.add_argument("--chat-sessions", type=int, default=400)
    p.add_argument("--seats", type=int, default=256)
    p.add_argument("--seed", type=int, default=0)


def workloads(args) -> dict[str, dict]:
    return {
        "azure_code": {"label": "Azure code trace", "overrides": [
            "workload=trace", "workload.path=azure_code", f"workload.num_requests={args.trace_requests}",
            f"workload.time_scale={args.trace_time_scale}"]},
        "azure_conv": {"label": "Azure conversation trace", "overrides": [
            "workload=trace", "workload.path=azure_conv", f"workload.num_requests={args.trace_requests}",
            f"workload.time_scale={args.trace_time_scale}"]},
        "short": {"label": "short requests (synthetic), a pool that binds", "overrides": [
            "workload=synthetic", f"workload.num_requests={args.short_requests}", f"workload.rate={args.short_rate}",
            "workload.prompt_len.dist=lognormal", "workload.prompt_len.mean=40", "workload.prompt_len.min=4",
            "workload.prompt_len.max=512", "workload.output_len.dist=lognormal", "workload.output_len.mean=20",
            "workload.output_len.min=2", "workload.output_len.max=256", f"max_num_seqs={args.short_seats}",
            f"backend.gpu_memory_utilization={args.short_gpu_memory_utilization}"]},
        "chat": {"label": f"chat_sessions ({args.chat_sessions} sessions), prefix caching on", "overrides": [
            "workload=chat_sessions", f"workload.num_sessions={args.chat_sessions}", "allocator.prefix_caching=true"]},
    }


def figures(r) -> dict:
    s = r.summary
    ttft = lat(r.records, "ttft_ms")
    return {"block_size": s.get("block_size"), "auto_reason": (s.get("block_size_auto") or {}).get("reason"),
            "kv_tokens": (s.get("num_kv_blocks") or 0) * (s.get("block_size") or 0),
            "waste": s.get("kv_waste_fraction"), "output_tok_s": s["output_throughput_tok_s"],
            "max_concurrent": s.get("max_concurrent_requests"), "preemptions": s["num_preemptions"],
            "hit_rate": s.get("prefix_cache_hit_rate"), "ttft_p50_ms": mean_p(ttft, 50), "ttft_p99_ms": mean_p(ttft, 99),
            "duration_s": s["duration_s"]}


def main(argv=None) -> dict:
    args = parse_args(__doc__, NAME, add_arguments, argv)
    quiet()
    t_start = time.perf_counter()
    base = SIM_70B + [f"max_num_seqs={args.seats}", f"backend.gpu_memory_utilization={args.gpu_memory_utilization}",
                      f"seed={args.seed}"]
    sim, time_model = {}, None
    for wname, w in workloads(args).items():
        print(f"block size, simulator: {w['label']}", flush=True)
        rows = []
        for size in args.sizes:
            r = run(f"{wname} block_size={size}", base + w["overrides"] + [f"block_size={size}"], None)
            time_model = time_model or r.time_model
            rows.append({"size": size, **figures(r)})
        sim[wname] = {"label": w["label"], "overrides": w["overrides"], "rows": rows}
    total = time.perf_counter() - t_start
    out = args.out_dir
    plot(sim, out)
    results = {"settings": {k: v for k, v in vars(args).items() if k != "out_dir"}, "overrides": base,
               "time_model": time_model, "sim": sim, "total_wall_s": round(total, 1),
               "date": time.strftime("%Y-%m-%d %H:%M")}
    write_json(out / "results.json", results)
    keys = [k for k in sim["azure_code"]["rows"][0] if k not in ("size", "auto_reason")]
    write_csv(out / "results.csv", ["workload", "size"] + keys,
              [[w, row["size"]] + [row[k] for k in keys] for w, d in sim.items() for row in d["rows"]])
    finish(args, NAME, page(args, results, total), headline(results))
    return results


def plot(sim: dict, out: Path) -> None:
    fig, axes = plt.subplots(1, 3, figsize=(16, 4))
    for wname, d in sim.items():
        fixed = [r for r in d["rows"] if r["size"] != "auto"]
        auto = next((r for r in d["rows"] if r["size"] == "auto"), None)
        xs = [int(r["size"]) for r in fixed]
        for ax, key in zip(axes, ("waste", "output_tok_s", "ttft_p99_ms")):
            line, = ax.plot(xs, [r[key] / (1e3 if key == "ttft_p99_ms" else 1) for r in fixed], "o-", label=wname)
            if auto:
                ax.plot([auto["block_size"]], [auto[key] / (1e3 if key == "ttft_p99_ms" else 1)], "*", ms=14,
                        color=line.get_color())
    for ax, title in zip(axes, ("KV waste (mean fraction of allocated slots unused)", "output tokens/s (engine time)",
                                "TTFT p99 (s)")):
        ax.set_xscale("log", base=2)
        ax.set(xlabel="block_size (star: auto's choice)", title=title)
        ax.set_xticks([8, 16, 32, 64], labels=["8", "16", "32", "64"])
        ax.minorticks_off()
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    save_figure(fig, out / "block_size.png")


def best(d: dict) -> dict:
    return max((r for r in d["rows"] if r["size"] != "auto"), key=lambda r: r["output_tok_s"])


def findings(sim: dict) -> list[str]:
    """Generated: how much the size moved throughput per workload, and how auto's choice did."""
    out = []
    for d in sim.values():
        fixed = [r for r in d["rows"] if r["size"] != "auto"]
        lo, hi = min(fixed, key=lambda r: r["output_tok_s"]), max(fixed, key=lambda r: r["output_tok_s"])
        auto = next((r for r in d["rows"] if r["size"] == "auto"), None)
        out.append(f"- **{d['label']}**: waste {min(r['waste'] for r in fixed):.1%} (block "
                   f"{min(fixed, key=lambda r: r['waste'])['size']}) to {max(r['waste'] for r in fixed):.1%} (block "
                   f"{max(fixed, key=lambda r: r['waste'])['size']}); throughput spread "
                   f"{(hi['output_tok_s'] / lo['output_tok_s'] - 1) * 100:.1f}% ({hi['size']} best, {lo['size']} worst)"
                   + (f"; auto chose {auto['block_size']}, {auto['output_tok_s'] / hi['output_tok_s']:.3f}x the best "
                      "fixed size" if auto else "") + ".")
    out.append("- Block size matters for throughput only where the pool binds and sequences are short: the last "
               "block's waste is then a large share of each sequence. With sequences of a thousand tokens the waste "
               "stays under 3% at every size and throughput moves by less than the preemption noise. The time model "
               "does not price per-block work, which is what favours larger blocks on a GPU; auto's overhead term "
               "stands in for it and is a stated estimate, not a measurement.")
    return out


def headline(res: dict) -> str:
    parts = []
    for d in res["sim"].values():
        b = best(d)
        auto = next((r for r in d["rows"] if r["size"] == "auto"), None)
        parts.append(f"{d['label']}: best fixed {b['size']} ({b['output_tok_s']:,.0f} tok/s, waste {b['waste']:.1%})"
                     + (f", auto chose {auto['block_size']} ({auto['output_tok_s'] / b['output_tok_s']:.3f}x the best)"
                        if auto else ""))
    return "; ".join(parts) + "."


def page(args, res: dict, total_wall: float) -> str:
    lines = [
        "## Block size: waste against per-block overhead and sharing granularity",
        "",
        "**Question.** A larger KV block means fewer block-table entries and kernel iterations, but more "
        "slots left empty in each sequence's last block and a coarser unit of prefix sharing. vLLM defaults to "
        "16. Which size wins for which length profile, and does `block_size=auto` find it?",
        "",
        f"**Setup.** Simulator, llama3_70b TP 8 on H100, {time_model_note(res['time_model'], 'sim')}, virtual "
        f"clock; `max_num_seqs={args.seats}`; the pool made scarce with "
        f"`backend.gpu_memory_utilization={args.gpu_memory_utilization}` so waste costs concurrency. The time "
        "model does not price the block size itself (per-block overhead is real on a GPU but not modelled here), "
        "so these runs measure the memory side only; auto's per-block overhead term is its own estimate.",
        "",
        f"Command: `python experiments/prefix_cache/block_size.py --update-readme`. {machine_line(total_wall)}",
        "",
    ]
    for d in res["sim"].values():
        auto = next((r for r in d["rows"] if r["size"] == "auto"), None)
        lines += [f"### {d['label']}", "", f"`{' '.join(d['overrides'])}`", "",
                  table(["block_size", "KV tokens", "waste", "output tok/s", "max concurrent", "preemptions",
                         "hit rate", "TTFT p50 s", "TTFT p99 s"],
                        [[r["size"] if r["size"] != "auto" else f"auto -> {r['block_size']}", r["kv_tokens"],
                          f"{(r['waste'] or 0):.2%}", r["output_tok_s"], r["max_concurrent"], r["preemptions"],
                          f"{r['hit_rate']:.2%}" if "allocator.prefix_caching=true" in d["overrides"] else "off",
                          r["ttft_p50_ms"] / 1e3,
                          r["ttft_p99_ms"] / 1e3] for r in d["rows"]]), ""]
        b = best(d)
        lines.append(f"- best fixed size by throughput: **{b['size']}** ({b['output_tok_s']:,.0f} tok/s, waste "
                     f"{b['waste']:.2%})" + (f"; auto: {auto['auto_reason']}" if auto and auto["auto_reason"] else ""))
        lines.append("")
    lines += ["### What it shows", "", *findings(res["sim"]), "", "![block size](block_size/block_size.png)", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
