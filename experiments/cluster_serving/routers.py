"""(a) Routers compared: every registered router on 4 replicas x TP 4 (16 simulated H100s), on the
Azure conversation and code traces, the Mooncake trace and synthetic chat sessions.

    python experiments/cluster_serving/routers.py                  # multirun/cluster_serving/<time>/routers/
    python experiments/cluster_serving/routers.py --update-readme  # experiments/cluster_serving/routers/ + README

Workloads (each built once, replayed under every router): the first ``--conv-requests`` rows of
``azure_conv`` (twice: busy at ``--conv-time-scale``, busier at
``--conv-hot-time-scale``) and ``--code-requests`` of ``azure_code`` (random prompt tokens: no prefix
sharing, prefix caching off), time compressed by those factors and ``--code-time-scale``; the first
``--mooncake-requests`` rows of the Mooncake conversation trace at 1/4 length (``block_tokens=128``),
time x``--mooncake-time-scale``, prefix caching on; ``chat_sessions`` (``--chat-sessions`` conversations,
each turn repeating the conversation so far, ``client_id`` = the conversation), prefix caching on.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (
    SIM_70B_TP4, SLO_TEXT, chat_requests, describe, figures, finish, machine_line, mooncake_requests, parse_args, plt,
    quiet, run, save_figure, slo_overrides, table, time_model_note, trace_requests, write_csv, write_json,
)

NAME = "routers"
ROUTERS = {"round_robin": ["router=round_robin"], "least_outstanding": ["router=least_outstanding"],
           "least_outstanding (tokens)": ["router=least_outstanding", "router.by=tokens"],
           "power_of_two": ["router=power_of_two"], "prefix_affinity": ["router=prefix_affinity"],
           "session": ["router=session"]}


def add_arguments(p) -> None:
    p.add_argument("--quick", action="store_true", help="a tiny version (the tests)")
    p.add_argument("--replicas", type=int, default=4)
    p.add_argument("--conv-requests", type=int, default=3000)
    p.add_argument("--conv-time-scale", type=float, default=0.25)
    p.add_argument("--conv-hot-time-scale", type=float, default=0.19,
                   help="the same conversation rows once more, at a higher rate")
    p.add_argument("--code-requests", type=int, default=2000)
    p.add_argument("--code-time-scale", type=float, default=0.4)
    p.add_argument("--mooncake-requests", type=int, default=1500)
    p.add_argument("--mooncake-time-scale", type=float, default=0.25)
    p.add_argument("--chat-sessions", type=int, default=500)
    p.add_argument("--chat-time-scale", type=float, default=0.25)
    p.add_argument("--seed", type=int, default=0)


def quick(args) -> None:
    if args.quick:
        args.replicas, args.conv_requests, args.code_requests, args.mooncake_requests, args.chat_sessions = 2, 80, 60, 60, 20


def registered() -> list[str]:
    from servelab.core.registry import default_registry

    return default_registry().names("router")


def workloads(args) -> dict[str, dict]:
    conv = trace_requests("azure_conv", args.conv_requests, args.seed)
    return {
        "azure_conv": {"label": f"Azure conversation trace, first {args.conv_requests} rows, time x{args.conv_time_scale:g}",
                       "requests": conv,
                       "overrides": ["workload=trace", "workload.path=azure_conv", f"workload.time_scale={args.conv_time_scale}"],
                       "time_scale": args.conv_time_scale, "prefix_caching": False},
        "azure_conv_hot": {"label": f"the same Azure conversation rows, time x{args.conv_hot_time_scale:g} (a higher rate)", "requests": conv,
                           "overrides": ["workload=trace", "workload.path=azure_conv",
                                         f"workload.time_scale={args.conv_hot_time_scale}"],
                           "time_scale": args.conv_hot_time_scale, "prefix_caching": False},
        "azure_code": {"label": f"Azure code trace, first {args.code_requests} rows, time x{args.code_time_scale:g}",
                       "requests": trace_requests("azure_code", args.code_requests, args.seed),
                       "overrides": ["workload=trace", "workload.path=azure_code", f"workload.time_scale={args.code_time_scale}"],
                       "time_scale": args.code_time_scale, "prefix_caching": False},
        "mooncake": {"label": f"Mooncake conversation trace, first {args.mooncake_requests} rows at 1/4 length, "
                              f"time x{args.mooncake_time_scale:g}, prefix caching on",
                     "requests": mooncake_requests(args.mooncake_requests, 128, args.seed),
                     "overrides": ["workload=hash_ids", "workload.block_tokens=128",
                                   f"workload.time_scale={args.mooncake_time_scale}", "allocator.prefix_caching=true"],
                     "time_scale": args.mooncake_time_scale, "prefix_caching": True},
        "chat": {"label": f"chat_sessions, {args.chat_sessions} conversations at 12/s, time x{args.chat_time_scale:g}, "
                          "prefix caching on",
                 "requests": chat_requests(args.chat_sessions, 12.0, args.seed),
                 "overrides": ["workload=chat_sessions", f"workload.time_scale={args.chat_time_scale}",
                               "allocator.prefix_caching=true"],
                 "time_scale": args.chat_time_scale, "prefix_caching": True},
    }


def main(argv=None) -> dict:
    args = parse_args(__doc__, NAME, add_arguments, argv)
    quick(args)
    quiet()
    t_start = time.perf_counter()
    names = registered()
    missing = sorted({ov[0].split("=", 1)[1] for ov in ROUTERS.values()} - set(names))
    if missing:
        raise SystemExit(f"routers not registered: {missing} (registered: {names})")
    base = SIM_70B_TP4 + [f"cluster.replicas={args.replicas}"] + slo_overrides("loose")
    res, time_model = {}, None
    for wname, w in workloads(args).items():
        w["stats"] = describe(w["requests"])
        print(f"routers: {w['label']} ({w['stats']['num_requests']} requests, "
              f"{w['stats']['native_rate_req_s'] / w['time_scale']:.3g} req/s)", flush=True)
        rows = []
        for router, ov in ROUTERS.items():
            r = run(f"{wname} {router}", base + w["overrides"] + ov, w["requests"])
            time_model = time_model or r.time_model
            rows.append({"router": router, **figures(r)})
        res[wname] = {"label": w["label"], "stats": w["stats"], "rate_req_s": w["stats"]["native_rate_req_s"] / w["time_scale"],
                      "prefix_caching": w["prefix_caching"], "rows": rows}
    total = time.perf_counter() - t_start
    out = args.out_dir
    plot(res, out)
    results = {"settings": {k: v for k, v in vars(args).items() if k != "out_dir"}, "overrides": base,
               "time_model": time_model, "workloads": res, "routers_registered": names,
               "total_wall_s": round(total, 1), "date": time.strftime("%Y-%m-%d %H:%M")}
    write_json(out / "results.json", results)
    keys = ["output_tok_s", "ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms", "tpot_p99_ms", "load_imbalance", "hit_rate",
            "att_loose", "goodput_loose", "preemptions"]
    write_csv(out / "results.csv", ["workload", "router"] + keys,
              [[w, row["router"]] + [row[k] for k in keys] for w, d in res.items() for row in d["rows"]])
    finish(args, NAME, page(args, results, total), headline(results))
    return results


def plot(res: dict, out: Path) -> None:
    fig, grid = plt.subplots(1, 3, figsize=(16, 4.2))
    wnames = list(res)
    routers = list(ROUTERS)
    width = 0.8 / len(routers)
    for j, router in enumerate(routers):
        xs = [i + (j - (len(routers) - 1) / 2) * width for i in range(len(wnames))]
        rows = [next(r for r in res[w]["rows"] if r["router"] == router) for w in wnames]
        base99 = [next(r for r in res[w]["rows"] if r["router"] == "round_robin")["ttft_p99_ms"] for w in wnames]
        grid[0].bar(xs, [r["ttft_p99_ms"] / b for r, b in zip(rows, base99)], width, label=router)
        grid[1].bar(xs, [r["hit_rate"] or 0 for r in rows], width, label=router)
        grid[2].bar(xs, [r["load_imbalance"] for r in rows], width, label=router)
    grid[0].set(title="TTFT p99 / round_robin's", ylabel="ratio")
    grid[0].axhline(1, color="k", lw=0.6)
    grid[1].set(title="prefix-cache hit rate", ylabel="fraction of prompt tokens")
    grid[2].set(title="load imbalance (max / mean requests per replica)", ylabel="ratio", ylim=(0.95, None))
    for ax in grid:
        ax.set_xticks(range(len(wnames)), wnames)
        ax.grid(alpha=0.3, axis="y")
    grid[0].legend(fontsize=7)
    save_figure(fig, out / "routers.png")


def _row(d: dict, router: str) -> dict:
    return next(r for r in d["rows"] if r["router"] == router)


def findings(res: dict) -> list[str]:
    out = []
    for wname, d in res.items():
        rr = _row(d, "round_robin")
        best99 = min(d["rows"], key=lambda r: r["ttft_p99_ms"])
        best50 = min(d["rows"], key=lambda r: r["ttft_p50_ms"])
        besthit = max(d["rows"], key=lambda r: r["hit_rate"] or 0)
        s = (f"- **{wname}** ({d['rate_req_s']:.3g} req/s): round_robin TTFT p50 / p99 {rr['ttft_p50_ms'] / 1e3:.3g} / "
             f"{rr['ttft_p99_ms'] / 1e3:.3g} s; the lowest p99 is {best99['router']}'s, {best99['ttft_p99_ms'] / 1e3:.3g} s "
             f"({best99['ttft_p99_ms'] / rr['ttft_p99_ms']:.2f}x round_robin's), the lowest p50 {best50['router']}'s "
             f"({best50['ttft_p50_ms'] / 1e3:.3g} s). TPOT p99 ranges {min(r['tpot_p99_ms'] for r in d['rows']):.3g}-"
             f"{max(r['tpot_p99_ms'] for r in d['rows']):.3g} ms; load imbalance "
             f"{min(r['load_imbalance'] for r in d['rows']):.3f}-{max(r['load_imbalance'] for r in d['rows']):.3f}.")
        if d["prefix_caching"]:
            s += (f" Hit rate: round_robin {rr['hit_rate']:.1%}, highest {besthit['router']} {besthit['hit_rate']:.1%}"
                  f" (TTFT p50 {besthit['ttft_p50_ms'] / 1e3:.3g} s vs {rr['ttft_p50_ms'] / 1e3:.3g} s, "
                  f"output {besthit['output_tok_s'] / rr['output_tok_s']:.2f}x).")
        out.append(s)
    return out


def headline(res: dict) -> str:
    parts = []
    for wname, d in res["workloads"].items():
        rr, lo, pa = _row(d, "round_robin"), _row(d, "least_outstanding"), _row(d, "prefix_affinity")
        if d["prefix_caching"]:
            parts.append(f"{wname}: prefix_affinity hit rate {pa['hit_rate']:.1%} vs round_robin {rr['hit_rate']:.1%}, "
                         f"TTFT p50 {pa['ttft_p50_ms'] / 1e3:.3g} s vs {rr['ttft_p50_ms'] / 1e3:.3g} s")
        else:
            parts.append(f"{wname}: TTFT p99 least_outstanding {lo['ttft_p99_ms'] / 1e3:.3g} s vs round_robin "
                         f"{rr['ttft_p99_ms'] / 1e3:.3g} s")
    return f"{res['settings']['replicas']} x TP 4 Llama-3-70B; " + "; ".join(parts) + "."


def page(args, res: dict, total_wall: float) -> str:
    lines = [
        "## (a) Routers",
        "",
        "**Question.** With identical replicas, does it matter where each request goes? Load-aware routers "
        "(vLLM production-stack, llm-d) should shorten queueing tails over round robin; a cache-aware router "
        "(SGLang's) should raise the prefix-cache hit rate where prompts share prefixes; a sticky `session` "
        "router keeps a conversation's growing history on one replica's cache.",
        "",
        f"**Setup.** {args.replicas} replicas x TP 4 of Llama-3-70B on H100 ({4 * args.replicas} GPUs), "
        f"{time_model_note(res['time_model'], 'sim')}, virtual clock, `max_num_seqs=256`, chunked prefill "
        f"(2048-token budget), block size 16, fcfs per replica. SLO for the goodput column: {SLO_TEXT['loose']}. "
        "Routers with their defaults (`router.by=requests` unless stated; `prefix_affinity`: "
        "`capacity_fraction`, `balance_rel`, `balance_abs` at their defaults). Each workload is built once and "
        "replayed under every router; rates are the workload's requests over its span after the time scaling. "
        f"Registered routers when run: {', '.join(f'`{n}`' for n in res['routers_registered'])}.",
        "",
        f"Command: `python experiments/cluster_serving/run.py --update-readme --only routers`. {machine_line(total_wall)}",
        "",
    ]
    for wname, d in res["workloads"].items():
        st = d["stats"]
        lines += [f"### {wname}: {d['label']}", "",
                  f"{st['num_requests']} requests at {d['rate_req_s']:.3g} req/s; prompt mean {st['prompt_mean']:.0f} "
                  f"(p50 {st['prompt_p50']:.0f}, p99 {st['prompt_p99']:.0f}) tokens, output mean {st['output_mean']:.0f} "
                  f"(p50 {st['output_p50']:.0f}).", "",
                  table(["router", "output tok/s", "TTFT p50 s", "TTFT p99 s", "TPOT p50 ms", "TPOT p99 ms",
                         "load imbalance", "hit rate", "SLO attainment", "goodput req/s", "requests per replica"],
                        [[r["router"], r["output_tok_s"], r["ttft_p50_ms"] / 1e3, r["ttft_p99_ms"] / 1e3, r["tpot_p50_ms"],
                          r["tpot_p99_ms"], f"{r['load_imbalance']:.3f}", f"{(r['hit_rate'] or 0):.1%}",
                          f"{r['att_loose']:.1%}", r["goodput_loose"], " / ".join(map(str, r["replica_requests"]))]
                         for r in d["rows"]]), ""]
    lines += ["### What it shows", "", *findings(res["workloads"]), "",
              "- `session` is sticky by `client_id`: the Azure and Mooncake rows carry none, so there it routes by "
              "load alone (as `least_outstanding`); only `chat` has clients (one per conversation).",
              "", "![routers](routers/routers.png)", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
