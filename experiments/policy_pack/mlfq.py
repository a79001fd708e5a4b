"""Skip-join MLFQ (FastServe) against FCFS on heavy-tailed output lengths, Llama-3-70B on 8
simulated H100s: job completion time (JCT) by load, what preemption costs, and long prompts.

    python experiments/policy_pack/mlfq.py                    # multirun/policy_pack/<time>/mlfq/
    python experiments/policy_pack/mlfq.py --update-readme    # experiments/policy_pack/mlfq/ + README section

1. A saturation run (every request at t = 0, fcfs) measures the stack's capacity: requests
   finished per second while the queue was non-empty.
2. The same requests arrive as a Poisson stream at ``--loads`` x that capacity (one seeded stream,
   compressed: ``workload.time_scale``); at each load ``fcfs``, ``mlfq`` + ``preemption=swap`` and
   ``mlfq`` + ``preemption=recompute``.
3. A mix where a fifth of the requests have 6k-12k-token prompts and short outputs, at one load:
   ``fcfs``, ``mlfq`` (skip-join: long prompts join low) and ``mlfq`` with ``scheduler.skip_join=false``.

Outputs ignore EOS (the simulator generates exactly ``max_tokens``): log-normal, median 128, sigma
1.5, capped at 8192; prompts uniform 64-1024 tokens. ``max_num_seqs=64`` (``--seats``) is the
scarce resource: the KV pool is not (its use is in the results). Everything on the virtual clock
(``time_model=auto``): the same numbers on any machine. About 2 minutes on 2 shared cores.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (
    SIM_70B, fmt, lat, machine_line, mean_p, parse_args, plt, quiet, run, save_figure, secs, table,
    time_model_note, write_csv, write_json, finish,
)

NAME = "mlfq"
MAX_MODEL_LEN = 16384
CLASSES = [(1, 64, "< 64"), (64, 512, "64-511"), (512, 2048, "512-2047"), (2048, 10 ** 9, ">= 2048")]


def add_arguments(p) -> None:
    p.add_argument("--num-requests", type=int, default=1500)
    p.add_argument("--seats", type=int, default=64, help="max_num_seqs (default: %(default)s)")
    p.add_argument("--loads", type=float, nargs="+", default=[0.8, 1.0, 1.3, 1.6],
                   help="offered load as multiples of the measured capacity")
    p.add_argument("--mix-load", type=float, default=1.2, help="load of the long-prompt mix")
    p.add_argument("--swap-space-gb", type=float, default=4.0, help="host swap pool per rank (vLLM's default 4)")
    p.add_argument("--seed", type=int, default=0)


# ---------------------------------------------------------------- workloads

def workload(n: int, seed: int, long_fraction: float = 0.0):
    """Seeded requests: unit-rate Poisson arrivals (scaled by ``workload.time_scale``), prompts
    uniform 64-1024, outputs log-normal (median 128, sigma 1.5) capped at 8192; a
    ``long_fraction`` of them are instead long-prompt, short-output requests (summarising a
    document: prompts uniform 6000-12000, outputs log-normal median 32, sigma 1)."""
    from servelab.core.request import Request

    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1.0, n))
    prompt = rng.integers(64, 1025, n)
    output = np.clip(np.round(rng.lognormal(np.log(128), 1.5, n)), 1, 8192).astype(int)
    is_long = rng.random(n) < long_fraction
    prompt[is_long] = rng.integers(6000, 12001, int(is_long.sum()))
    output[is_long] = np.clip(np.round(rng.lognormal(np.log(32), 1.0, int(is_long.sum()))), 1, 8192)
    output = np.minimum(output, MAX_MODEL_LEN - prompt)
    tokens = rng.integers(0, 32000, int(prompt.sum()))
    starts = np.concatenate(([0], np.cumsum(prompt)[:-1]))
    requests = [Request(id=f"r{i:05d}", prompt_token_ids=tuple(tokens[s:s + p].tolist()), max_tokens=int(o),
                        arrival_time=float(a))
                for i, (s, p, o, a) in enumerate(zip(starts, prompt, output, arrivals))]
    return requests, {f"r{i:05d}": bool(x) for i, x in enumerate(is_long)}


def at_once(requests):
    from dataclasses import replace

    return [replace(r, arrival_time=0.0) for r in requests]


def capacity(records) -> float:
    """Requests per engine second the stack sustains with every seat taken: the output tokens it
    generated while the queue was non-empty (every request arrived at 0), per second, over the
    mean output length of the workload."""
    admitted = max(r["arrival_s"] + r["queue_ms"] / 1e3 for r in records)
    tokens = 0
    for r in records:
        first = r["arrival_s"] + r["ttft_ms"] / 1e3
        times = first + np.concatenate(([0.0], np.cumsum(r["itl_ms"] or []))) / 1e3
        tokens += int((times <= admitted).sum())
    mean_output = np.mean([r["output_len"] for r in records])
    return float(tokens / admitted / mean_output)


# ---------------------------------------------------------------- instrumentation

def churn_probe(stack) -> dict:
    """Counts swap decisions the loop executed as recompute because the same step swaps a
    sequence in (``QueueScheduler._preempt``: no swap-out in a plan that swaps in), and how often
    the victim was the very sequence swapped in by that step; and each request's join level."""
    sched = stack.engine.scheduler
    data = {"swap_fallbacks": 0, "fallback_victim_swapped_in_same_step": 0, "victims_mid_recompute": 0,
            "join_level": {}}
    if hasattr(sched, "join_level"):
        inner_join = sched.join_level

        def join_level(seq, _inner=inner_join):
            level = _inner(seq)
            data["join_level"][seq.id] = level
            return level
        sched.join_level = join_level
    if not all(hasattr(sched, a) for a in ("_swap_in", "_preempt", "swapped", "preemption")):
        return data  # the loop changed: no diagnostic, the figures still stand
    state = {"plan": None, "ids": set()}
    inner_swap_in, inner_preempt = sched._swap_in, sched._preempt

    def swap_in(plan):
        before = {s.id for s in sched.swapped}
        inner_swap_in(plan)
        state["plan"], state["ids"] = plan, before - {s.id for s in sched.swapped}

    def preempt(victim, plan):
        if victim.num_preemptions and victim.num_computed_tokens < victim.num_tokens - 1:
            data["victims_mid_recompute"] += 1  # preempted again before its recomputation finished
        if plan.swap_in and sched.preemption.decide(victim).kind == "swap":
            data["swap_fallbacks"] += 1
            if state["plan"] is plan and victim.id in state["ids"]:
                data["fallback_victim_swapped_in_same_step"] += 1
        inner_preempt(victim, plan)

    sched._swap_in, sched._preempt = swap_in, preempt
    return data


# ---------------------------------------------------------------- figures of a run

def figures(r, is_long=None) -> dict:
    e2e = lat(r.records)
    s = r.summary
    kinds = s.get("num_preemptions_by_kind") or {}
    npre = np.array([rec["num_preemptions"] for rec in r.records])
    out = {
        "mean_jct_ms": mean_p(e2e), "p50_jct_ms": mean_p(e2e, 50), "p99_jct_ms": mean_p(e2e, 99),
        "preemptions": s["num_preemptions"], "swaps": kinds.get("swap", 0), "recomputes": kinds.get("recompute", 0),
        "recomputed_tokens": s["recomputed_tokens"], "prompt_tokens": s["prompt_tokens"],
        "swap_out_gb": s["swap_out_bytes"] / 1e9, "throughput_tok_s": s["output_throughput_tok_s"],
        "duration_s": s["duration_s"], "max_preemptions_one_request": int(npre.max()) if npre.size else 0,
        "requests_preempted_10_plus": int((npre >= 10).sum()), "kv_utilization_max": s["kv_utilization_max"],
        "swap_fallbacks": r.extra.get("swap_fallbacks"),
        "fallback_victim_swapped_in_same_step": r.extra.get("fallback_victim_swapped_in_same_step"),
        "victims_mid_recompute": r.extra.get("victims_mid_recompute"),
    }
    for lo, hi, label in CLASSES:
        out[f"mean_jct_ms[{label}]"] = mean_p(lat(r.records, where=lambda rec, lo=lo, hi=hi: lo <= rec["output_len"] < hi))
    if is_long is not None:
        levels = r.extra.get("join_level") or {}
        for flag, label in ((True, "long prompts"), (False, "other prompts")):
            out[f"mean_jct_ms[{label}]"] = mean_p(lat(r.records, where=lambda rec, f=flag: is_long[rec["id"]] == f))
            lv = [v for k, v in levels.items() if is_long.get(k) == flag]
            out[f"mean_join_level[{label}]"] = float(np.mean(lv)) if lv else None
    return out


def ratio(a, b):
    return None if a is None or b is None or b == 0 else a / b


# ---------------------------------------------------------------- main

def main(argv=None) -> dict:
    args = parse_args(__doc__, NAME, add_arguments, argv)
    quiet()
    t_start = time.perf_counter()
    base = SIM_70B + [f"max_num_seqs={args.seats}"]
    swap = ["preemption=swap", f"backend.swap_space_gb={args.swap_space_gb}"]
    stacks = {"fcfs": ["scheduler=fcfs"], "mlfq + swap": ["scheduler=mlfq", *swap],
              "mlfq + recompute": ["scheduler=mlfq", "preemption=recompute"]}

    requests, _ = workload(args.num_requests, args.seed)
    class_counts = {label: sum(1 for r in requests if lo <= r.max_tokens < hi) for lo, hi, label in CLASSES}
    print(f"MLFQ: {len(requests)} requests; saturation run", flush=True)
    sat = run("saturation (fcfs, all at t=0)", base + ["scheduler=fcfs"], at_once(requests))
    cap = capacity(sat.records)
    print(f"  capacity {cap:.2f} req/s", flush=True)

    rows, runs_out = [], []
    for load in args.loads:
        rate = load * cap
        for label, ov in stacks.items():
            r = run(f"{label} @ {load:g}x ({rate:.2f} req/s)", base + ov + [f"workload.time_scale={float(1 / rate)!r}"],
                    requests, instrument=churn_probe)
            f = figures(r)
            r.extra.pop("join_level", None)  # per request: not worth keeping
            rows.append({"load": load, "rate_req_s": rate, "stack": label, **f})
            runs_out.append({"load": load, "stack": label, **r.compact()})

    # the long-prompt mix
    mix, is_long = workload(args.num_requests, args.seed + 1, long_fraction=0.2)
    sat_mix = run("mix saturation (fcfs, all at t=0)", base + ["scheduler=fcfs"], at_once(mix))
    cap_mix = capacity(sat_mix.records)
    mix_rate = args.mix_load * cap_mix
    mix_stacks = {"fcfs": ["scheduler=fcfs"], "mlfq + swap (skip-join)": ["scheduler=mlfq", *swap],
                  "mlfq + swap, skip_join=false": ["scheduler=mlfq", *swap, "scheduler.skip_join=false"]}
    mix_rows = []
    for label, ov in mix_stacks.items():
        r = run(f"mix: {label}", base + ov + [f"workload.time_scale={float(1 / mix_rate)!r}"], mix, instrument=churn_probe)
        mix_rows.append({"stack": label, **figures(r, is_long)})
        r.extra.pop("join_level", None)
        runs_out.append({"mix": True, "stack": label, **r.compact()})
    total = time.perf_counter() - t_start

    results = {
        "settings": {k: v for k, v in vars(args).items() if k not in ("out_dir",)},
        "overrides": base, "time_model": sat.time_model, "capacity_req_s": cap, "mix_capacity_req_s": cap_mix,
        "mix_rate_req_s": mix_rate, "class_counts": class_counts, "num_kv_blocks": sat.summary["num_kv_blocks"],
        "saturation_kv_utilization_max": sat.summary["kv_utilization_max"],
        "rows": rows, "mix_rows": mix_rows, "runs": runs_out, "total_wall_s": round(total, 1),
        "date": time.strftime("%Y-%m-%d %H:%M"),
    }
    out = args.out_dir
    write_json(out / "results.json", results)
    keys = ["load", "rate_req_s", "stack", "mean_jct_ms", "p50_jct_ms", "p99_jct_ms", "preemptions", "swaps",
            "recomputes", "swap_fallbacks", "fallback_victim_swapped_in_same_step", "recomputed_tokens",
            "prompt_tokens", "swap_out_gb", "throughput_tok_s", "max_preemptions_one_request",
            "requests_preempted_10_plus", "victims_mid_recompute", "kv_utilization_max"] + [f"mean_jct_ms[{c[2]}]" for c in CLASSES]
    write_csv(out / "results.csv", keys, [[row.get(k) for k in keys] for row in rows])
    mix_keys = ["stack", "mean_jct_ms", "p50_jct_ms", "p99_jct_ms", "mean_jct_ms[long prompts]",
                "mean_jct_ms[other prompts]", "mean_join_level[long prompts]", "mean_join_level[other prompts]",
                "preemptions", "swaps", "recomputes", "throughput_tok_s"]
    write_csv(out / "long_prompts.csv", mix_keys, [[row.get(k) for k in mix_keys] for row in mix_rows])
    plot(rows, args.loads, out)
    finish(args, NAME, page(args, results, total), headline(args, results))
    return results


def plot(rows, loads, out: Path) -> None:
    stacks = list(dict.fromkeys(r["stack"] for r in rows))
    fig, axes = plt.subplots(1, 3, figsize=(14, 3.8))
    for stack in stacks:
        pts = [r for r in rows if r["stack"] == stack]
        for ax, key in zip(axes[:2], ("mean_jct_ms", "p99_jct_ms")):
            ax.plot([p["load"] for p in pts], [p[key] / 1e3 for p in pts], "o-", label=stack)
    for ax, what in zip(axes[:2], ("mean", "p99")):
        ax.set(xlabel="offered load (x measured capacity)", ylabel=f"{what} JCT (s)", title=f"{what} job completion time")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    top = max(loads)
    ax = axes[2]
    width = 0.8 / len(stacks)
    for i, stack in enumerate(stacks):
        row = next(r for r in rows if r["stack"] == stack and r["load"] == top)
        vals = [(row[f"mean_jct_ms[{c[2]}]"] or np.nan) / 1e3 for c in CLASSES]
        ax.bar(np.arange(len(CLASSES)) + i * width, vals, width, label=stack)
    ax.set_xticks(np.arange(len(CLASSES)) + width * (len(stacks) - 1) / 2, [c[2] for c in CLASSES])
    ax.set(yscale="log", xlabel="output tokens", ylabel="mean JCT (s)", title=f"by output length, load {top:g}x")
    ax.grid(alpha=0.3, axis="y")
    ax.legend(fontsize=8)
    save_figure(fig, out / "jct.png")


def headline(args, res: dict) -> str:
    by = {(r["load"], r["stack"]): r for r in res["rows"]}
    top = max(args.loads)
    f, sw, rc = by[(top, "fcfs")], by[(top, "mlfq + swap")], by[(top, "mlfq + recompute")]
    return (f"claimed up to 5.1x lower mean JCT than run-to-completion FCFS; here (70B, TP 8, {args.seats} seats, "
            f"heavy-tailed outputs, {top:g}x capacity) mlfq + swap has {sw['p50_jct_ms'] / f['p50_jct_ms']:.2f}x fcfs's median "
            f"JCT, {sw['mean_jct_ms'] / f['mean_jct_ms']:.2f}x its mean and {sw['p99_jct_ms'] / f['p99_jct_ms']:.2f}x its p99; "
            f"mlfq + recompute {rc['mean_jct_ms'] / f['mean_jct_ms']:.2f}x its mean, recomputing "
            f"{rc['recomputed_tokens'] / rc['prompt_tokens']:.0%} of all prompt tokens.")


def page(args, res: dict, total_wall: float) -> str:
    rows, mix_rows, cap = res["rows"], res["mix_rows"], res["capacity_req_s"]
    by = {(r["load"], r["stack"]): r for r in rows}
    loads = args.loads
    top = max(loads)

    def g(load, stack, key):
        return by[(load, stack)][key]

    main_table = table(
        ["load", "req/s", "stack", "mean JCT s", "p50 JCT s", "p99 JCT s", "mean vs fcfs", "p99 vs fcfs",
         "preemptions (swap / recompute)", "recomputed tokens", "output tok/s"],
        [[f"{r['load']:g}x", r["rate_req_s"], r["stack"], r["mean_jct_ms"] / 1e3, r["p50_jct_ms"] / 1e3,
          r["p99_jct_ms"] / 1e3,
          "-" if r["stack"] == "fcfs" else f"{ratio(r['mean_jct_ms'], g(r['load'], 'fcfs', 'mean_jct_ms')):.2f}x",
          "-" if r["stack"] == "fcfs" else f"{ratio(r['p99_jct_ms'], g(r['load'], 'fcfs', 'p99_jct_ms')):.2f}x",
          f"{r['swaps']} / {r['recomputes']}", r["recomputed_tokens"], r["throughput_tok_s"]] for r in rows])
    class_table = table(
        ["stack"] + [f"{c[2]} output tokens ({res['class_counts'][c[2]]} requests)" for c in CLASSES],
        [[s] + [(g(top, s, f"mean_jct_ms[{c[2]}]") or float("nan")) / 1e3 for c in CLASSES]
         for s in ("fcfs", "mlfq + swap", "mlfq + recompute")])
    cost_table = table(
        ["load", "stack", "preemptions", "swap decisions run as recompute (same step swapped in)",
         "... victim = the sequence swapped in that step", "recomputed / prompt tokens", "swapped out GB",
         "max preemptions of one request", "requests preempted >= 10 times", "output tok/s vs fcfs"],
        [[f"{r['load']:g}x", r["stack"], r["preemptions"], r["swap_fallbacks"] if "swap" in r["stack"] else "-",
          r["fallback_victim_swapped_in_same_step"] if "swap" in r["stack"] else "-",
          f"{r['recomputed_tokens'] / r['prompt_tokens']:.0%}", r["swap_out_gb"], r["max_preemptions_one_request"],
          r["requests_preempted_10_plus"],
          f"{r['throughput_tok_s'] / g(r['load'], 'fcfs', 'throughput_tok_s'):.3f}"]
         for r in rows if r["stack"] != "fcfs"])
    mix_table = table(
        ["stack", "mean JCT s", "p99 JCT s", "mean JCT s, long prompts", "mean JCT s, other prompts",
         "mean join level, long prompts", "mean join level, others", "preemptions"],
        [[r["stack"], r["mean_jct_ms"] / 1e3, r["p99_jct_ms"] / 1e3, r["mean_jct_ms[long prompts]"] / 1e3,
          r["mean_jct_ms[other prompts]"] / 1e3, r["mean_join_level[long prompts]"],
          r["mean_join_level[other prompts]"], r["preemptions"]] for r in mix_rows])

    # ---- generated sentences
    def verdict(stack, key="mean_jct_ms", band=0.01):
        """Loads where ``stack`` beats fcfs on ``key`` by more than ``band`` (ties are not wins)."""
        return [ld for ld in loads if g(ld, stack, key) < (1 - band) * g(ld, "fcfs", key)]

    def worse(stack, key):
        return [ld for ld in loads if g(ld, stack, key) > 1.01 * g(ld, "fcfs", key)]

    swap_wins, rec_wins = verdict("mlfq + swap"), verdict("mlfq + recompute")
    idle = [ld for ld in loads if all(abs(g(ld, st, "mean_jct_ms") / g(ld, "fcfs", "mean_jct_ms") - 1) <= 0.01
                                    for st in ("mlfq + swap", "mlfq + recompute"))]
    best_load = min(loads, key=lambda ld: ratio(g(ld, "mlfq + swap", "mean_jct_ms"), g(ld, "fcfs", "mean_jct_ms")))
    best = ratio(g(best_load, "fcfs", "mean_jct_ms"), g(best_load, "mlfq + swap", "mean_jct_ms"))
    p50_gain = ratio(g(top, "fcfs", "p50_jct_ms"), g(top, "mlfq + swap", "p50_jct_ms"))
    short, longest = CLASSES[0][2], CLASSES[-1][2]
    rec_top = by[(top, "mlfq + recompute")]
    swap_top = by[(top, "mlfq + swap")]
    long_mix = {r["stack"]: r for r in mix_rows}
    fc_m, sj_m, ns_m = (long_mix["fcfs"], long_mix["mlfq + swap (skip-join)"], long_mix["mlfq + swap, skip_join=false"])

    lines = []
    if idle:
        lines.append(
            f"- **Below capacity, no difference.** At {', '.join(f'{ld:g}x' for ld in idle)} the {args.seats} seats were "
            "rarely all taken: mlfq preempted "
            + ", ".join(f"{g(ld, 'mlfq + swap', 'preemptions')} (swap) / {g(ld, 'mlfq + recompute', 'preemptions')} "
                        f"(recompute) times at {ld:g}x" for ld in idle)
            + " and every mean JCT is within 1% of fcfs's.")
    if p50_gain and p50_gain > 1:
        lines.append(
            f"- **Median and short requests: the mechanism works.** At {top:g}x the median JCT falls "
            f"{fmt(p50_gain)}x with mlfq + swap ({secs(g(top, 'fcfs', 'p50_jct_ms'))} -> {secs(g(top, 'mlfq + swap', 'p50_jct_ms'))}), "
            f"and requests of {short} output tokens finish in {secs(g(top, 'mlfq + swap', f'mean_jct_ms[{short}]'))} "
            f"on average instead of {secs(g(top, 'fcfs', f'mean_jct_ms[{short}]'))}: they no longer queue behind long jobs.")
    else:
        lines.append(f"- **Not even the median improves** at {top:g}x: fcfs {secs(g(top, 'fcfs', 'p50_jct_ms'))}, "
                     f"mlfq + swap {secs(g(top, 'mlfq + swap', 'p50_jct_ms'))}.")
    ties = [ld for ld in loads if ld not in swap_wins and ld not in worse("mlfq + swap", "mean_jct_ms")]
    loses = worse("mlfq + swap", "mean_jct_ms")
    loadlist = lambda ls: ", ".join(f"{ld:g}x" for ld in ls)  # noqa: E731
    if swap_wins:
        lines.append(
            f"- **Mean JCT: only in overload{', only with swap' if not rec_wins else ''}.** mlfq + swap lowers the mean JCT by more than 1% only "
            f"at {loadlist(swap_wins)} (best {fmt(best)}x at {best_load:g}x, against FastServe's up to 5.1x over Orca)"
            + (f"; it ties fcfs (within 1%) at {loadlist(ties)}" if ties else "")
            + (f" and raises it at {loadlist(loses)}" if loses else "")
            + ". mlfq + recompute "
            + ("never beats fcfs on the mean." if not rec_wins else f"beats it only at {loadlist(rec_wins)}."))
    else:
        lines.append(
            f"- **Mean JCT: the claim does not hold here.** mlfq + swap never lowers the mean JCT by more than 1% "
            f"(closest {ratio(g(best_load, 'mlfq + swap', 'mean_jct_ms'), g(best_load, 'fcfs', 'mean_jct_ms')):.2f}x at "
            f"{best_load:g}x), mlfq + recompute {'never' if not rec_wins else 'only at ' + loadlist(rec_wins)}.")
    p99_worse = worse("mlfq + swap", "p99_jct_ms")
    lines.append(
        f"- **p99 JCT is worse** with mlfq + swap at {loadlist(p99_worse) or 'no load'} (at {top:g}x: fcfs "
        f"{secs(g(top, 'fcfs', 'p99_jct_ms'))}, mlfq + swap {secs(g(top, 'mlfq + swap', 'p99_jct_ms'))}, mlfq + recompute "
        f"{secs(g(top, 'mlfq + recompute', 'p99_jct_ms'))}); requests of {longest} output tokens take "
        f"{secs(g(top, 'mlfq + swap', f'mean_jct_ms[{longest}]'))} on average instead of "
        f"{secs(g(top, 'fcfs', f'mean_jct_ms[{longest}]'))}.")
    lines.append(
        f"- **Recompute preemption is where it loses most.** At {top:g}x mlfq + recompute preempted "
        f"{rec_top['preemptions']:,} times and recomputed {rec_top['recomputed_tokens']:,} tokens, "
        f"{rec_top['recomputed_tokens'] / rec_top['prompt_tokens']:.0%} of all prompt tokens; output throughput "
        f"{rec_top['throughput_tok_s'] / g(top, 'fcfs', 'throughput_tok_s'):.1%} of fcfs's. One request was preempted "
        f"{rec_top['max_preemptions_one_request']} times, {rec_top['requests_preempted_10_plus']} requests 10 times "
        f"or more, and {rec_top['victims_mid_recompute']:,} of the preemptions hit a request that had not yet "
        "finished recomputing its context after the previous one (all of that recomputation thrown away): a "
        "long job readmitted into a freed seat sits on the lowest level, last in the running order, so it is "
        "the first victim of the next arrival.")
    if swap_top.get("swap_fallbacks") is not None:
        lines.append(
            f"- **Swap ran as recompute {swap_top['recomputes'] / max(1, swap_top['preemptions']):.0%} of the time.** Of mlfq + swap's {swap_top['preemptions']:,} preemptions at {top:g}x, "
            f"{swap_top['recomputes']:,} ran as recompute: {swap_top['swap_fallbacks']:,} because the same step swapped "
            f"another sequence in (the loop never swaps out in a step that swaps in), and in "
            f"{swap_top['fallback_victim_swapped_in_same_step']:,} of those the victim *was* the sequence that step had "
            "just swapped in (its KV copied back, then thrown away). It still recomputed "
            f"{swap_top['recomputed_tokens']:,} tokens ({swap_top['recomputed_tokens'] / swap_top['prompt_tokens']:.0%} "
            "of the prompt tokens).")
    lp = "mean_jct_ms[long prompts]"
    skip_cost = sj_m[lp] / ns_m[lp]
    lines.append(
        f"- **Long prompts.** In the mix (a fifth of the requests summarise: 6k-12k-token prompts, outputs of median "
        f"32 tokens; {args.mix_load:g}x its capacity of {fmt(res['mix_capacity_req_s'])} req/s) skip-join puts the long "
        f"prompts on level {fmt(sj_m['mean_join_level[long prompts]'])} on average, the rest on "
        f"{fmt(sj_m['mean_join_level[other prompts]'])}. The long-prompt requests' mean JCT: fcfs "
        f"{secs(fc_m[lp])}, mlfq {secs(sj_m[lp])}, mlfq with skip_join=false (everyone starts on level 0) "
        f"{secs(ns_m[lp])}: "
        + (f"joining low costs them {skip_cost - 1:.0%}." if skip_cost > 1.01 else
           "joining low did not cost them here: with short outputs they still rank above the long-output jobs, "
           "which demote to levels 3-4 within a few hundred tokens.")
        + f" The whole mix's mean JCT: fcfs {secs(fc_m['mean_jct_ms'])}, mlfq {secs(sj_m['mean_jct_ms'])}, "
        f"skip_join=false {secs(ns_m['mean_jct_ms'])}; the other requests' mean {secs(fc_m['mean_jct_ms[other prompts]'])}, "
        f"{secs(sj_m['mean_jct_ms[other prompts]'])}, {secs(ns_m['mean_jct_ms[other prompts]'])}.")
    verdict_text = "\n".join(lines)
    kv = res["saturation_kv_utilization_max"]
    return f"""## MLFQ: skip-join multi-level feedback queue (FastServe)

**Claim.** FastServe (Wu et al., "Fast Distributed Inference Serving for Large Language Models",
arXiv:2305.05920) preempts at token granularity with a skip-join MLFQ (a new job joins the queue
its prompt's cost implies; quanta grow by level) and swaps KV to the host proactively; its first
version reports up to 5.1x lower average and 6.4x lower tail job completion time (JCT) than Orca's
run-to-completion FCFS, the later one up to 31.4x the throughput of vLLM under the same average
latency target.

**Our setup.** Simulator (`backend=sim`), llama3_70b, TP 8 on H100 (`hardware=h100`),
{time_model_note(res['time_model'], 'sim')}, virtual clock; chunked prefill with a 2,048-token
step budget; `max_num_seqs={args.seats}` (a latency-oriented cap, a quarter of vLLM's default 256):
the seats are the scarce resource. The KV pool ({res['num_kv_blocks']:,} blocks of 16 tokens per
rank at `gpu_memory_utilization=0.9`) was at most {kv:.0%} used even with every request queued
at once, so no fcfs run preempted. `preemption=swap` with a {args.swap_space_gb:g} GiB host pool
per rank (vLLM's default). `scheduler=mlfq` with its defaults: quanta [4, 16, 64, 256, 1024] output
tokens, skip-join by the prefill's cost in decode iterations, no starvation bound.
Workload: {args.num_requests:,} requests, prompts uniform 64-1,024 tokens, outputs log-normal (median
128, sigma 1.5, capped at 8,192; `ignore_eos`: each generates exactly its length), one seeded Poisson
stream compressed to each load. Load = rate / capacity, capacity = {fmt(cap)} req/s: the requests
finished per second while the queue was non-empty in a run with every request arriving at t = 0
(fcfs). {machine_line(total_wall)}

    python experiments/policy_pack/mlfq.py --update-readme

![mean and p99 JCT by load; mean JCT by output length at the highest load](mlfq/jct.png)

{main_table}

Mean JCT by output length at {top:g}x:

{class_table}

What the preemptions cost (mlfq only; fcfs never preempted):

{cost_table}

Long prompts (`long_prompts.csv`): {args.num_requests:,} requests of which a fifth have 6,000-12,000-token
prompts and short outputs (log-normal, median 32, sigma 1), at {args.mix_load:g}x ({fmt(res['mix_rate_req_s'])} req/s),
`preemption=swap`:

{mix_table}

**Where the claim holds, where it does not.**

{verdict_text}

**Why.** FastServe's gain comes from head-of-line blocking in a run-to-completion server: short jobs
wait for long ones to *finish*. With continuous batching and {args.seats} seats, a short job waits
only for a *seat*, and at loads below capacity one frees up within a few steps, so there is
nothing to win. Above capacity MLFQ behaves like least-attained-service: whoever arrives takes the
seat of a job that has run longest, so short jobs fly through and the median collapses, while the
long jobs stop whenever anyone arrives. The mean JCT of a heavy-tailed mix is dominated by those
long jobs, whose service alone is minutes at 70B, so the mean moves little and the tail gets
worse. Each preemption also costs work: recompute prefills the victim's whole context again
(thousands of tokens for a long job, paid in the steps every running decode shares), and the
victims are exactly the long-context jobs; swap avoids most of that, but the engine's loop turned
{swap_top['recomputes'] / max(1, swap_top['preemptions']):.0%} of mlfq's swap preemptions at {top:g}x into
recomputes (see the cost table) and brings swapped jobs back before admitting anyone, in FIFO order
rather than mlfq's. Skip-join prices a 6k-12k-token prefill at
tens of decode iterations and starts it a level or two down; whether that hurts depends on who
else is on the levels above, which is why the mix is measured rather than argued.
"""


if __name__ == "__main__":
    from servelab.core.errors import ServelabError

    try:
        main(sys.argv[1:])
    except ServelabError as exc:
        sys.exit(f"mlfq.py: error: {exc}")
