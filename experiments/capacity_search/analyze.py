"""Capacity search README: the table and plot of search.py's results, and the continuous-vs-static
batching figures at 70B in the simulator beside the CPU ones.

    python experiments/capacity_search/search.py              # multirun/capacity_search/<time>/results.json, .csv
    python run.py -m experiment=continuous_vs_static_sim      # multirun/continuous_vs_static_sim/<time>/
    python experiments/capacity_search/step_times.py          # step_times.json
    python experiments/capacity_search/analyze.py [CONTINUOUS_VS_STATIC_SIM_DIR]

Reads the newest ``multirun/capacity_search/<time>/results.json`` (and ``results_memory_tight.json``)
that search.py wrote, else the committed ones beside this script. Writes README.md, capacity.png and
continuous_vs_static_sim.png to the analysis folder (``--update-readme``: next to this script, with the
results it read copied there too).
"""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from common import (REPO, UPDATE_FLAG, load_runs, optional_sweep, output_dir, plt, save_figure, table,  # noqa: E402
                    write_page)

CPU_README = HERE.parent / "continuous_vs_static" / "README.md"


def fails_on(row: dict, st: dict) -> str | None:
    """Which limit the first failing rate above the found one broke (older results lack the field)."""
    if row.get("fails_on") or row["fail_rate_req_s"] is None:
        return row.get("fails_on")
    p = next(p for p in row["probes"] if p["rate"] == row["fail_rate_req_s"])
    broke = [n for n, bad in (("unfinished", not p["complete"]), ("TTFT", p["ttft_p99_ms"] > st["ttft_ms"]),
                              ("TPOT", (p["tpot_p99_ms"] or 0) > st["tpot_ms"])) if bad]
    return "+".join(broke) or None


def two(x: float | None) -> str | None:
    return None if x is None else f"{x:.2f}"


def capacity_table(res: dict) -> str:
    st = res["settings"]
    rows = []
    for r in sorted(res["rows"], key=lambda r: -r["tp"]):
        rows.append([r["tp"], r["scheduler"], "chunked" if r["chunked_prefill"] else "whole", r["preemption"],
                     two(r["max_rate_req_s"]), two(r["fail_rate_req_s"]), fails_on(r, st), r.get("output_tok_s"),
                     r.get("output_tok_s_per_gpu"), r.get("total_tok_s_per_gpu"), r.get("ttft_p99_ms"),
                     r.get("tpot_p99_ms"), r.get("num_preemptions"), r.get("kv_utilization_max"), r["num_probes"]])
    return table(["TP", "scheduler", "prefill", "preemption", "max rate req/s", "fails at req/s", "fails on",
                  "output tok/s", "output tok/s per GPU", "prompt+output tok/s per GPU", "p99 TTFT ms",
                  "p99 TPOT ms", "preemptions", "KV use max", "runs"], rows)


def plot_capacity(series: list[tuple[str, dict]], stacks: list[str], title: str, path: Path) -> None:
    fig, ax = plt.subplots(figsize=(7.5, 0.5 * len(stacks) + 1.4 + 0.25 * len(series)))
    height = 0.8 / len(series)
    for i, (label, by_stack) in enumerate(series):
        ys = [j + i * height for j in range(len(stacks))]
        ax.barh(ys, [(by_stack.get(s) or {}).get("max_rate_req_s") or 0 for s in stacks], height, label=label)
    ax.set_yticks([j + height * (len(series) - 1) / 2 for j in range(len(stacks))], stacks, fontsize=8)
    ax.invert_yaxis()
    ax.set(xlabel="highest request rate within the SLOs (req/s)", title=title)
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.09), ncol=1, frameon=False)
    save_figure(fig, path)


def roofline_at(st: dict, tp: int, time_model: str = "auto") -> dict:
    """The time model's breakdown (ms) of one step carrying a full prefill chunk at ``tp``, and the hardware."""
    from servelab.api import compose
    from servelab.assemble.stack import build_stack
    from servelab.core.step_work import StepWork

    cfg = compose(["backend=sim", f"hardware={st['hardware']}", f"model={st['model']}", f"tensor_parallel_size={tp}",
                   f"time_model={time_model}"], logger="none", progress=False)
    stack = build_stack(cfg)
    n = st["chunk_budget"]
    work = StepWork(num_tokens=n, num_seqs=1, prefill_tokens=n, num_sampled=1, attended=n * (n + 1) // 2,
                    context_tokens=n)
    out = {k: v * 1e3 for k, v in stack.time_model.breakdown(work).items()}
    stack.executor.shutdown()
    return {**out, "host_link_gb_s": cfg.hardware.host_link_gb_s}


def time_model_label(res: dict) -> str:
    """``auto -> op_profile (h100/llama2_70b tables)`` or the plain name."""
    tm = res.get("time_model_config") or {}
    name = res.get("time_model", tm.get("name", "roofline"))
    if name == "auto" and tm.get("chosen"):
        tables = tm.get("tables") or {}
        where = f" ({tables['hardware']}/{tables['model']} op tables, Vidur)" if tables else ""
        return f"auto -> {tm['chosen']}{where}"
    return name


def time_model_text(tm: dict, tp: int) -> str:
    """One sentence on what priced the steps, from the time model's ``describe()``."""
    weights = f"weights {tm.get('weight_bytes_per_rank', 0) / 1e9:.1f} GB per rank at TP {tp}."
    if tm.get("name") == "roofline":
        return (f"Roofline coefficients: flops_efficiency {tm.get('flops_efficiency')}, bandwidth_efficiency "
                f"{tm.get('bandwidth_efficiency')}, link_efficiency {tm.get('link_efficiency')}, "
                f"{tm.get('allreduces_per_layer')} all-reduces per layer, step_overhead_ms {tm.get('step_overhead_ms')}; "
                + weights)
    priced = tm.get("priced_by") or {}
    parts = "; ".join(f"{k}: {v}" for k, v in priced.items())
    return (f"Each step is priced from measured operator tables where they exist ({parts}); "
            "see [docs/simulator.md](../../docs/simulator.md). " + weights)


def chunk_text(chunk: dict) -> str:
    """``12 ms of decoder layers, 3.1 ms of attention, ...`` from a breakdown in ms."""
    names = {"linear": "GEMMs", "layers": "decoder layers", "attention": "attention", "communication": "all-reduce",
             "lm_head": "LM head", "host": "host", "overhead": "overhead"}
    return ", ".join(f"{chunk[k]:.1f} ms of {v}" for k, v in names.items() if chunk.get(k))


def what_changed(res: dict, tight: dict | None) -> str:
    """Best rates per TP degree under this time model against the roofline tables kept beside the page."""
    old_file = HERE / "results_roofline.json"
    if res.get("time_model", "roofline") == "roofline" or not old_file.is_file():
        return ""
    old = json.loads(old_file.read_text())

    def best(rows, tp):
        r = max((r for r in rows if r["tp"] == tp), key=lambda r: r["max_rate_req_s"] or 0)
        return r["max_rate_req_s"] or 0.0, r["stack"], r.get("output_tok_s_per_gpu") or 0.0

    tps = sorted({r["tp"] for r in res["rows"]}, reverse=True)
    rows = []
    for tp in tps:
        (a, sa, ga), (b, sb, gb) = best(old["rows"], tp), best(res["rows"], tp)
        rows.append(f"  - TP {tp}: {a:.2f} -> {b:.2f} req/s at best ({pct(b, a)}; {sa} -> {sb}); "
                    f"{ga:.0f} -> {gb:.0f} output tok/s per GPU")
    per_gpu_old = {tp: best(old["rows"], tp)[2] for tp in tps}
    per_gpu_new = {tp: best(res["rows"], tp)[2] for tp in tps}
    verdict = ""
    if len(tps) == 2:
        small, large = min(tps), max(tps)
        was = per_gpu_old[small] > per_gpu_old[large]
        now = per_gpu_new[small] > per_gpu_new[large]
        verdict = (f"  - TP {small} vs TP {large} per GPU: TP {small} " + ("still " if was == now else "")
                   + ("serves more" if now else "serves less") + f" per GPU ({per_gpu_new[small]:.0f} against "
                   f"{per_gpu_new[large]:.0f} output tok/s" + (")" if was == now else
                   f"; under the roofline it was {per_gpu_old[small]:.0f} against {per_gpu_old[large]:.0f})") + ".")
    return ("\n## What changed with measured operator times\n\nThe tables above were made with the plain "
            "`roofline` until 2026-12-02 (its results stay beside this page as `results_roofline.json`). "
            "Priced from measured GPU operators instead (`time_model=auto`: per-layer times, the 35 us NCCL "
            "all-reduce floor it missed, host time per step):\n\n" + "\n".join(rows)
            + ("\n" + verdict if verdict else "") + "\n")


def pct(a: float, b: float) -> str:
    return f"{(a / b - 1) * 100:+.0f}%"


def capacity_section(res: dict, tight: dict | None, out: Path) -> str:
    st = res["settings"]
    rows = res["rows"]
    tps = sorted({r["tp"] for r in rows}, reverse=True)
    stacks = list(dict.fromkeys(r["stack"] for r in rows))
    by = {(r["tp"], r["stack"]): r for r in rows}
    rate = lambda tp, stack: by[(tp, stack)]["max_rate_req_s"] or 0.0  # noqa: E731
    hw = st["hardware"].upper()
    series = [(f"TP {tp} ({tp} x {hw})", {s: by[(tp, s)] for s in stacks}) for tp in tps]
    if tight:
        tst = tight["settings"]
        for tp in sorted({r["tp"] for r in tight["rows"]}, reverse=True):
            series.append((f"TP {tp}, {' '.join(tst['override'])}",
                           {r["stack"]: r for r in tight["rows"] if r["tp"] == tp}))
    plot_capacity(series, stacks, f"{st['model']}: p99 TTFT <= {st['ttft_ms'] / 1e3:g} s, p99 TPOT <= {st['tpot_ms']:g} ms",
                  out / "capacity.png")

    tm = res.get("time_model_config") or {}
    sl = next(iter(res["trace_slices"].values()))
    best = {tp: max((by[(tp, s)] for s in stacks), key=lambda r: r["max_rate_req_s"] or 0) for tp in tps}
    headline = "; ".join(
        f"TP {tp}: {best[tp]['max_rate_req_s']:.2f} req/s at best ({best[tp]['stack']}), "
        f"{best[tp].get('output_tok_s_per_gpu', 0):.0f} output tok/s "
        f"({best[tp].get('total_tok_s_per_gpu', 0):,.0f} prompt+output tok/s) per GPU" for tp in tps)

    # findings, from the numbers
    f = []
    base = "fcfs / chunked / recompute"
    if all((tp, base) in by for tp in tps):
        slo = "slo_aware / chunked / recompute"
        whole = "fcfs / whole prompts / recompute"
        if all((tp, slo) in by for tp in tps):
            f.append("**Scheduler**: `slo_aware` serves more within the SLOs than fcfs ("
                     + ", ".join(f"{pct(rate(tp, slo), rate(tp, base))} at TP {tp}" for tp in tps)
                     + ", chunked prefill, recompute).")
        same = [s for s in stacks if s.startswith("priority") and all(
            (tp, s) in by and rate(tp, s) == rate(tp, s.replace("priority", "fcfs", 1)) for tp in tps)]
        if same and not any(by[(tp, s)].get("num_preemptions") for tp in tps for s in same):
            f.append("`priority` equals `fcfs` to the digit: the trace carries no priorities and no request "
                     "was preempted, so its one difference (whom it preempts) never acts.")
        if all((tp, whole) in by for tp in tps):
            f.append("**Chunked prefill** ({} -token steps) against whole prompts, fcfs: ".format(st["chunk_budget"]).replace(" -", "-")
                     + ", ".join(f"{pct(rate(tp, base), rate(tp, whole))} at TP {tp}" for tp in tps)
                     + ". Whole prompts fail first on "
                     + "/".join(sorted({fails_on(by[(tp, whole)], st) or "-" for tp in tps}))
                     + " (a long prompt's step stalls every running decode), chunked on "
                     + "/".join(sorted({fails_on(by[(tp, base)], st) or "-" for tp in tps}))
                     + "; but a step carrying a full chunk costs most of the TPOT budget at 70B (the p99 TPOT "
                       "column sits just under 100 ms), so neither leaves much room.")
    pre = [r for r in rows if r.get("num_preemptions")]
    kv = {tp: max(by[(tp, s)].get("kv_utilization_max") or 0 for s in stacks) for tp in tps}
    if not pre:
        f.append("**Preemption mode**: no run at a passing rate preempted anything (KV use at most "
                 + ", ".join(f"{kv[tp]:.0%} at TP {tp}" for tp in tps)
                 + f"), so recompute and swap are identical. Llama-3.1-70B's grouped KV (8 heads: "
                   f"{tm.get('kv_bytes_per_token_per_rank', 0) / 1024:.0f} KiB per token per rank at TP {tps[0]}) leaves "
                   f"room for far more than {st['max_num_seqs']} sequences of this trace in 80 GB; the SLOs bound "
                   "the concurrency (Little's law: rate x time in system) long before memory does. The "
                   "memory-tight table below takes the pool down to where preemption happens.")
    if len(tps) == 2:
        a, b = tps
        f.append(f"**TP {b} vs TP {a}**: TP {b} serves {rate(b, base) / rate(a, base):.2f}x the rate of TP {a} with "
                 f"{b / a:.2f}x the GPUs (fcfs, chunked): "
                 f"{by[(b, base)].get('output_tok_s_per_gpu', 0):.0f} against "
                 f"{by[(a, base)].get('output_tok_s_per_gpu', 0):.0f} output tok/s per GPU. Per GPU the smaller "
                 "group wins: each rank reads more weights per step, but the all-reduces (serial in "
                 "this time model, 2 per layer) cost less, and under a TPOT SLO the step budget is what counts.")
    odd = [f"{r['stack']} at TP {r['tp']}" for r in rows + (tight["rows"] if tight else [])
           if any(p["ok"] for p in r["probes"]) and any(not p["ok"] for p in r["probes"])
           and max(p["rate"] for p in r["probes"] if p["ok"]) > min(p["rate"] for p in r["probes"] if not p["ok"])]
    f.append("**Monotone?** " + ("In every search, each rate that passed lies below each rate that failed."
                                 if not odd else "Not everywhere: a rate passed above one that failed in "
                                 + "; ".join(odd) + " (see the probes in the results JSON)."))
    findings = "\n".join(f"- {x}" for x in f)
    tm_name = res.get("time_model", "roofline")
    chunk = roofline_at(st, tps[0], tm_name)

    tight_text = ""
    if tight:
        tst = tight["settings"]
        tby = {(r["tp"], r["stack"]): r for r in tight["rows"]}
        pairs = [(tp, s.rsplit(" / ", 1)[0]) for (tp, s) in tby if s.endswith("/ recompute")]
        gains = [f"{pct(tby[(tp, p + ' / swap')]['max_rate_req_s'], tby[(tp, p + ' / recompute')]['max_rate_req_s'])} "
                 f"for {p} (TP {tp})" for tp, p in pairs if (tp, p + " / swap") in tby]
        pool = tight["rows"][0]["at_max_rate"]
        tight_text = f"""
### Memory-tight: where the preemption mode matters

The same search with `{' '.join(tst['override'])}` (the run may use {float(tst['override'][0].split('=')[1]):.0%} of each
GPU's memory, as if the rest went to something else; KV pool {pool['num_kv_blocks']:,} blocks of 16 tokens per rank
at TP {pool['tensor_parallel_size']}):

    python experiments/capacity_search/search.py --tp {' '.join(map(str, tst['tp']))} {' '.join('--override ' + o for o in tst['override'])} --name results_memory_tight

{capacity_table(tight)}

Swap against recompute: {', '.join(gains)}. Preempted requests keep their KV on the host (swap,
over the {chunk['host_link_gb_s']:g} GB/s host link of this hardware profile) instead of recomputing their prompt and
generated tokens later, which costs prefill time that every other request's TTFT and TPOT pay for.
"""

    cmd_flags = "" if st["num_requests"] == 2000 else f" --num-requests {st['num_requests']}"
    return f"""# Capacity search: the highest request rate within the SLOs

The seeds' question, "maximise throughput without violating the TTFT SLA", asked of the
simulator: for **{st['model']} on {' and '.join(f'{tp} x {hw}' for tp in tps)} (tensor parallel
{' and '.join(map(str, tps))})**, replaying the Azure LLM inference trace (conversation) at scaled rates,
the highest request rate whose **p99 TTFT <= {st['ttft_ms']:g} ms and p99 TPOT <= {st['tpot_ms']:g} ms**, for each
stack (scheduler x chunked prefill x preemption mode), by bisection on the rate.
**Clock: virtual; time model: {time_model_label(res)}; hardware: {hw} (`hardware={st['hardware']}`), `backend=sim`.**

    python experiments/capacity_search/search.py{cmd_flags}     # multirun/capacity_search/<time>/results.json, .csv ({res['total_wall_s'] / 60:.0f} min here)
    python experiments/capacity_search/analyze.py    # this page and capacity.png

**{headline}.**

![capacity](capacity.png)

{capacity_table(res)}

Figures at the highest passing rate. "Fails at": the lowest rate probed above it, which failed
("fails on": the limit it broke); the search stops when the two are within {st['rel_tol'] * 100:g}%. Tokens per
second per GPU = the run's throughput / TP degree; "prompt+output" counts prompt tokens as served
tokens too.

{findings}
{tight_text}
## How these numbers were made

- **Clock: virtual. Time model: {time_model_label(res)}. Hardware: `{st['hardware']}`** (the spec sheet in
  `conf/hardware/{st['hardware']}.yaml`), `backend=sim` (no weights, no tensors; the same engine and
  policy classes as a real run). {time_model_text(tm, tps[0])} Every figure is a function of config + trace
  + seed: rerunning gives the same table on any machine.
- **Workload**: `{Path(st['trace']).name}`, rows {st['start_row']}..{st['start_row'] + sl['num_requests'] - 1}
  ({sl['num_requests']} requests arriving over the first {sl['span_s']:.0f} s of the trace, {sl['native_rate_req_s']:.2f} req/s of
  their own); prompt and output lengths as in the trace (EOS ignored: each request generates its
  trace output length), clipped to max_model_len {st['max_model_len']}. A rate R replays the same
  requests with `workload.time_scale = {sl['native_rate_req_s']:.2f} / R`: the trace's burstiness is kept, only
  compressed. `--num-requests` sets the slice (0 = the whole trace, 19,366 requests over an hour).
- **Stack knobs held fixed**: max_num_seqs {st['max_num_seqs']} (vLLM's default), block size 16, paged
  allocator without prefix caching; chunked prefill = a {st['chunk_budget']}-token step budget, whole
  prompts = a {st['max_model_len']}-token budget (vLLM's default without chunking: max_model_len);
  `preemption=swap` with a {st['swap_space_gb']:g} GiB host pool per rank (vLLM's default `swap_space`).
  `slo.ttft_ms` / `slo.tpot_ms` are set to the SLOs for every stack (only `slo_aware` reads them).
- **Search**: from the slice's own rate, double while the run passes (halve while it fails), then
  bisect; a run passes when every request finishes and both p99s are within the SLOs. Every probe
  (rate, pass, p99s, wall time) is in `results.json`. Searched on {res['machine']}, {res['date']}
  (2 cores shared with other jobs): {sum(r['num_probes'] for r in rows)} sim runs in {res['total_wall_s']:.0f} s wall.
  Since the simulator's fast-forward (`sim.fast_forward`, Dec 3; same results) one stack's search
  (`--tp 8 --schedulers fcfs --chunked on --preemption recompute`, 9 runs) takes 18 s wall against
  25 s step by step (`--override sim.fast_forward=false`) and 25 s before: its probes run near
  capacity, where few steps are quiet (docs/simulator.md, "How fast").
- **Caveats of the model**: the all-reduces come after the compute (no overlap); at TP {tps[0]} a
  {st['chunk_budget']}-token prefill step is {chunk_text(chunk)}. How far each time model is from measured GPU
  operators and from published serving benchmarks: [sim_fidelity_gpu](../sim_fidelity_gpu/README.md).
  Comparisons between stacks share the model's assumptions.
{what_changed(res, tight)}
"""


def cpu_ratios() -> dict[int, float]:
    """The fcfs/static ratios stated by experiments/continuous_vs_static/README.md."""
    if not CPU_README.is_file():
        return {}
    line = next((x for x in CPU_README.read_text().splitlines() if "ratio fcfs / static:" in x), "")
    return {int(n): float(x) for x, n in re.findall(r"([\d.]+)x at max_num_seqs=(\d+)", line)}


def cpu_clock() -> str:
    """Which clock made the CPU figures, as their README says."""
    text = CPU_README.read_text() if CPU_README.is_file() else ""
    return "virtual clock, a profile of the CPU" if "virtual clock" in text else "wall clock"


def cvs_section(sweep: Path | None, steps: dict | None, out: Path) -> str:
    if sweep is None:
        return ("## Continuous vs static batching at 70B (simulator)\n\nNot run yet: "
                "`python run.py -m experiment=continuous_vs_static_sim`.\n")
    runs = load_runs(sweep)
    by = {(r.config["scheduler"]["name"], r.config["max_num_seqs"]): r for r in runs}
    seats = sorted({k[1] for k in by})
    cpu = cpu_ratios()
    occupancy = {}
    for key, r in by.items():
        recs = r.steps()
        occupancy[key] = sum(s["num_seqs"] for s in recs) / len(recs)
    rows, ratios = [], {}
    for n in seats:
        c, s = by[("fcfs", n)].summary, by[("static", n)].summary
        ratios[n] = c["output_throughput_tok_s"] / s["output_throughput_tok_s"]
        rows.append([n, c["output_throughput_tok_s"], s["output_throughput_tok_s"], f"**{ratios[n]:.2f}x**",
                     f"{cpu[n]:.2f}x" if n in cpu else "-", occupancy[("fcfs", n)], occupancy[("static", n)],
                     c["duration_s"], s["duration_s"]])

    fig, ax = plt.subplots(figsize=(5, 3.5))
    sim_tm = runs[0].config["time_model"]["name"]
    ax.plot(seats, [ratios[n] for n in seats], "o-", label=f"70B, 4 x A100 (sim, time_model={sim_tm})")
    if cpu:
        ax.plot(sorted(cpu), [cpu[n] for n in sorted(cpu)], "s--", label=f"tiny model, CPU ({cpu_clock()})")
    ax.set(xlabel="max_num_seqs", ylabel="throughput fcfs / static", title="Continuous vs static batching")
    ax.set_xscale("log", base=2)
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)
    save_figure(fig, out / "continuous_vs_static_sim.png")

    cfg = runs[0].config
    wl = cfg["workload"]
    text = f"""## Continuous vs static batching at 70B (simulator)

The seeds claim continuous batching gives 2-4x the throughput of static batching. The CPU
experiment (`experiment=continuous_vs_static`, the tiny model on this 2-core CPU, {cpu_clock()}) found
less at larger batches. The same workload ({wl['num_requests']} requests at once, prompts uniform
{wl['prompt_len']['min']}-{wl['prompt_len']['max']}, outputs lognormal median {wl['output_len']['mean']:g}, sigma {wl['output_len']['sigma']:g},
{wl['output_len']['min']}-{wl['output_len']['max']} tokens) on **Llama-2-70B, 4 x A100-80GB (TP 4), `backend=sim`, virtual clock,
time_model={sim_tm}** (defaults above, hardware `a100_80gb`):

    python run.py -m experiment=continuous_vs_static_sim   # conf/experiment/continuous_vs_static_sim.yaml (seconds)
    python experiments/capacity_search/step_times.py        # the step-time table below
    python experiments/capacity_search/analyze.py

{table(["max_num_seqs", "fcfs output tok/s (sim)", "static output tok/s (sim)", "ratio, 70B sim",
        "ratio, CPU", "mean seqs per step, fcfs", "mean seqs per step, static", "fcfs duration s",
        "static duration s"], rows)}

The CPU column is the figure stated by `experiments/continuous_vs_static/README.md` (the tiny
model on a shared 2-core machine, {cpu_clock()}; that page says how it was made). "Mean seqs per step" is from the sim runs'
`steps.jsonl`: static batching spends most of its steps on the few long members of each batch.

![continuous vs static](continuous_vs_static_sim.png)
"""
    if steps:
        cpu_s, sim_s = steps["cpu"], steps["sim"]
        batches = sorted(int(b) for b in sim_s)
        srows = []
        for b in batches:
            c, s = cpu_s.get(str(b)), sim_s[str(b)]
            bd = s.get("breakdown_ms", {})
            srows.append([b, c["median_ms"] if c else None, c["median_ms"] / b if c else None, s["median_ms"],
                          s["median_ms"] / b, bd.get("linear", bd.get("layers")), bd.get("attention"),
                          bd.get("communication"), bd.get("overhead", bd.get("host"))])
        first, last = batches[0], batches[-1]
        cpu_growth = cpu_s[str(last)]["median_ms"] / cpu_s[str(first)]["median_ms"]
        sim_growth = sim_s[str(last)]["median_ms"] / sim_s[str(first)]["median_ms"]
        bd_first, bd_last = sim_s[str(first)]["breakdown_ms"], sim_s[str(last)]["breakdown_ms"]
        summary = runs[0].summary
        weights_gb = summary["sim_weight_bytes_per_rank"] / 1e9
        tm = summary["time_model"]
        occ = ", ".join(f"{occupancy[('fcfs', n)] / occupancy[('static', n)]:.1f}x at {n}" for n in seats)
        peak = cfg["hardware"]["peak_tflops"]
        eff = tm.get("flops_efficiency") or (tm.get("calibration") or tm.get("coefficients") or {}).get("gemm_eff_max", 0.75)
        bw_eff = tm.get("bandwidth_efficiency") or (tm.get("calibration") or tm.get("coefficients") or {}).get("bw_eff", 0.8)
        linear_first = bd_first.get("linear", bd_first.get("layers", 0.0))
        flops_ms = 2 * last * (weights_gb * 1e9 / 2) / (peak * 1e12 * eff) * 1e3
        span = lambda d: f"{min(d.values()):.1f}-{max(d.values()):.1f}x"  # noqa: E731
        text += f"""
### Why the gain differs: a decode step's time against its batch

Decode-only steps of B requests with {steps['prompt_len']}-token prompts, median step time (the same probe
through the same engine, `step_times.py`; CPU measured on {steps['machine']}, {steps['date']}):

{table(["batch B", "CPU ms/step (wall)", "CPU ms/token", "70B sim ms/step", "70B sim ms/token", "sim: layers ms",
        "sim: attention ms", "sim: all-reduce ms", "sim: host ms"], srows)}

From batch {first} to {last} a CPU decode step gets **{cpu_growth:.1f}x** slower; the 70B step on 4 x A100 only
**{sim_growth:.2f}x** ({sim_s[str(first)]['median_ms']:.1f} -> {sim_s[str(last)]['median_ms']:.1f} ms). At 70B a decode step is bound by reading the weights:
{weights_gb:.1f} GB of bf16 weights per rank over about {bw_eff:.2g} x {cfg['hardware']['hbm_bandwidth_gb_s']:,.0f} GB/s of HBM: the decoder layers take {linear_first:.1f} ms at batch {first}
(the matmuls' FLOPs at batch {last} would take {flops_ms:.1f} ms at {eff:.2g} x {peak:g} TFLOP/s: still
under the weight read, so the step stays memory-bound); what grows with the batch is the all-reduced activations ({bd_first['communication']:.1f} -> {bd_last['communication']:.1f} ms) and
the attention's KV reads ({bd_first['attention']:.3f} -> {bd_last['attention']:.2f} ms at these short contexts). A step with {first}
sequence costs nearly what a step with {last} costs, so every empty seat is lost throughput: the
ratio tracks the mean occupied seats per step (fcfs / static: {occ}), and falls short of it by
the prefill steps, whose cost does grow with the tokens they carry (more of fcfs's time at more seats). On the CPU the tiny model's
step grows with the batch (per-token compute and the attention's gathers, no large weight read to
amortise), so the nearly empty tail steps of a static batch are cheap too and static batching loses
less: **{span(cpu)} on the CPU against {span(ratios)} at 70B**. The ratio is also set by the workload: a
static batch lasts as long as its longest member, so it grows with the spread of output lengths
(here lognormal with sigma {wl['output_len']['sigma']:g}); the seeds' 2-4x does not state its workload.
"""
    return text


def results_file(name: str) -> Path:
    """``<name>.json`` of the newest search.py run under ``multirun/capacity_search/``, else the committed one."""
    runs = sorted((REPO / "multirun" / "capacity_search").glob(f"*/{name}.json"), key=lambda p: p.parent.name)
    return runs[-1] if runs else HERE / f"{name}.json"


def main() -> None:
    res_file, tight_file = results_file("results"), results_file("results_memory_tight")
    print(f"capacity results: {res_file}; memory-tight: {tight_file}", flush=True)
    res = json.loads(res_file.read_text())
    tight = json.loads(tight_file.read_text()) if tight_file.is_file() else None
    if UPDATE_FLAG in sys.argv[1:]:  # the committed page says "results.json": keep the data it was made from beside it
        for f in (res_file, tight_file):
            for src in (f, f.with_suffix(".csv")):
                if src.is_file() and src.parent != HERE:
                    shutil.copyfile(src, HERE / src.name)
    sweep = optional_sweep("continuous_vs_static_sim")
    out = output_dir(HERE, sweep, "capacity_search")
    steps_file = HERE / "step_times.json"
    steps = json.loads(steps_file.read_text()) if steps_file.is_file() else None
    write_page(out, capacity_section(res, tight, out) + "\n" + cvs_section(sweep, steps, out))


if __name__ == "__main__":
    main()
