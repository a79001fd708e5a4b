"""(b) Colocated vs disaggregated prefill/decode at an equal GPU count, in the spirit of DistServe's
and Splitwise's figures: goodput per GPU under TTFT and TPOT SLOs, by request rate and prompt-length
mix; the P:D split at 16 GPUs; and what the KV transfer costs as the link slows.

    python experiments/cluster_serving/disagg.py                  # multirun/cluster_serving/<time>/disagg/
    python experiments/cluster_serving/disagg.py --update-readme  # experiments/cluster_serving/disagg/ + README

1. 8 GPUs: 2 x TP 4 colocated (``router=least_outstanding``) against 1 prefill TP 4 + 1 decode TP 4 (one
   node: the KV moves over NVLink, overlapped with the prefill), at each rate of ``--rates-*``, on three
   prompt-length mixes: Azure conversation (short prompts, longer outputs), Azure code (long prompts,
   outputs of a few tokens) and a synthetic long-prompt, long-output mix (Poisson; prompts 2048-6144,
   outputs 128-512 tokens, uniform). Goodput per GPU = requests meeting both SLOs / s / GPUs, for three
   SLO pairs, computed from the same runs.
2. 16 GPUs: 4 colocated against (P, D) = (1, 3), (2, 2), (3, 1), each workload at ``--pd-rate-factor`` x
   its highest 8-GPU rate.
3. The link: 1 + 1 with ``cluster.kv_link=inter_node`` and ``hardware.inter_node_link_gb_s`` in
   ``--links`` (per GPU; 4 lanes at TP 4), overlap on and off, on the conversation trace and the long mix.
   And one request alone (4096-token prompt): TTFT colocated against disaggregated by link, against the
   transfer time the link formula gives.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (
    SIM_70B_TP4, SLO_TEXT, SLOS, describe, figures, finish, machine_line, native_rate, parse_args, plt, quiet, run,
    save_figure, slo_overrides, synthetic_requests, table, time_model_note, trace_requests, write_csv, write_json,
)

NAME = "disagg"
KV_BYTES_PER_TOKEN = 80 * 8 * 128 * 2 * 2  # Llama-3-70B: layers x KV heads x head dim x (K, V) x bf16


def add_arguments(p) -> None:
    p.add_argument("--quick", action="store_true", help="a tiny version (the tests)")
    p.add_argument("--conv-requests", type=int, default=2000)
    p.add_argument("--code-requests", type=int, default=1500)
    p.add_argument("--long-requests", type=int, default=600)
    p.add_argument("--rates-conv", type=float, nargs="+", default=[4, 6, 8, 10])
    p.add_argument("--rates-code", type=float, nargs="+", default=[1, 2, 3, 4])
    p.add_argument("--rates-long", type=float, nargs="+", default=[1, 2, 3, 4])
    p.add_argument("--pd-rate-factor", type=float, default=2.0)
    p.add_argument("--links", type=float, nargs="+", default=[50, 12.5, 3, 1])
    p.add_argument("--link-rate-conv", type=float, default=6.0)
    p.add_argument("--link-rate-long", type=float, default=2.0)
    p.add_argument("--seed", type=int, default=0)


def quick(args) -> None:
    if args.quick:
        args.conv_requests, args.code_requests, args.long_requests = 60, 40, 30
        args.rates_conv, args.rates_code, args.rates_long = [6], [2], [2]
        args.links = [50, 1]


COLOC_8 = ("colocated 2 x TP4", ["cluster.replicas=2", "router=least_outstanding"])
DISAGG_8 = ("disaggregated 1P + 1D", ["cluster.prefill_replicas=1", "cluster.decode_replicas=1", "router=least_outstanding"])


def workloads(args) -> dict[str, dict]:
    return {
        "azure_conv": {"label": f"Azure conversation, first {args.conv_requests} rows (short prompts)",
                       "requests": trace_requests("azure_conv", args.conv_requests, args.seed),
                       "overrides": ["workload=trace", "workload.path=azure_conv"], "rates": args.rates_conv},
        "azure_code": {"label": f"Azure code, first {args.code_requests} rows (long prompts, short outputs)",
                       "requests": trace_requests("azure_code", args.code_requests, args.seed),
                       "overrides": ["workload=trace", "workload.path=azure_code"], "rates": args.rates_code},
        "long_mix": {"label": f"synthetic, {args.long_requests} requests (prompts 2048-6144, outputs 128-512)",
                     "requests": synthetic_requests(args.long_requests, 1.0, (2048, 6144), (128, 512), args.seed),
                     "overrides": ["workload=synthetic"], "rates": args.rates_long},
    }


def at_rate(w: dict, rate: float) -> list[str]:
    return w["overrides"] + [f"workload.time_scale={native_rate(w['requests']) / rate:.6g}"]


def main(argv=None) -> dict:
    args = parse_args(__doc__, NAME, add_arguments, argv)
    quick(args)
    quiet()
    t_start = time.perf_counter()
    base = SIM_70B_TP4 + slo_overrides("loose")
    ws = workloads(args)
    time_model = None

    sweep = {}  # 1. rate sweeps at 8 GPUs
    for wname, w in ws.items():
        w["stats"] = describe(w["requests"])
        print(f"disagg: {w['label']}, rates {w['rates']}", flush=True)
        rows = []
        for rate in w["rates"]:
            for label, ov in (COLOC_8, DISAGG_8):
                r = run(f"{wname} {rate:g}/s {label}", base + ov + at_rate(w, rate), w["requests"])
                time_model = time_model or r.time_model
                rows.append({"rate": rate, "config": label, **figures(r)})
        sweep[wname] = {"label": w["label"], "stats": w["stats"], "rows": rows}

    pd = {}  # 2. the P:D split at 16 GPUs
    for wname, w in ws.items():
        rate = args.pd_rate_factor * max(w["rates"])
        rows = []
        configs = [("colocated 4 x TP4", ["cluster.replicas=4"])] + [
            (f"disaggregated {p}P + {4 - p}D", [f"cluster.prefill_replicas={p}", f"cluster.decode_replicas={4 - p}"])
            for p in (1, 2, 3)]
        for label, ov in configs:
            r = run(f"{wname} {rate:g}/s {label}", base + ov + ["router=least_outstanding"] + at_rate(w, rate), w["requests"])
            rows.append({"rate": rate, "config": label, **figures(r)})
        pd[wname] = {"rate": rate, "rows": rows}

    links = {}  # 3. the link
    for wname, rate in (("azure_conv", args.link_rate_conv), ("long_mix", args.link_rate_long)):
        w, rows = ws[wname], []
        for bw in args.links:
            for overlap in (True, False):
                ov = DISAGG_8[1] + ["cluster.kv_link=inter_node", f"hardware.inter_node_link_gb_s={bw:g}",
                                    f"cluster.overlap_kv_transfer={str(overlap).lower()}"]
                r = run(f"{wname} {rate:g}/s link {bw:g} GB/s overlap {overlap}", base + ov + at_rate(w, rate), w["requests"])
                rows.append({"link_gb_s": bw, "overlap": overlap, **figures(r)})
        ref = next(r for r in sweep[wname]["rows"] if r["rate"] == rate and r["config"] == COLOC_8[0]) \
            if any(r["rate"] == rate for r in sweep[wname]["rows"]) else None
        links[wname] = {"rate": rate, "rows": rows, "colocated": ref}
    alone = lone_request(args, base)

    total = time.perf_counter() - t_start
    out = args.out_dir
    plot(sweep, pd, links, out)
    results = {"settings": {k: v for k, v in vars(args).items() if k != "out_dir"}, "overrides": base,
               "time_model": time_model, "slos": SLOS, "sweep": sweep, "pd": pd, "links": links, "alone": alone,
               "total_wall_s": round(total, 1), "date": time.strftime("%Y-%m-%d %H:%M")}
    write_json(out / "results.json", results)
    keys = ["output_tok_s", "ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms", "tpot_p99_ms"] + \
        [f"goodput_per_gpu_{s}" for s in SLOS] + ["kv_transfer_bytes", "kv_exposed_ms_mean"]
    csv_rows = [["sweep", w, row["rate"], row["config"], "", ""] + [row[k] for k in keys]
                for w, d in sweep.items() for row in d["rows"]]
    csv_rows += [["pd16", w, row["rate"], row["config"], "", ""] + [row[k] for k in keys] for w, d in pd.items() for row in d["rows"]]
    csv_rows += [["link", w, d["rate"], "disaggregated 1P + 1D", row["link_gb_s"], row["overlap"]] + [row[k] for k in keys]
                 for w, d in links.items() for row in d["rows"]]
    write_csv(out / "results.csv", ["part", "workload", "rate", "config", "link_gb_s", "overlap"] + keys, csv_rows)
    finish(args, NAME, page(args, results, total), headline(results))
    return results


def lone_request(args, base: list[str]) -> dict:
    """One 4096-token prompt alone: TTFT colocated (one replica) and disaggregated by link and overlap,
    with the transfer time the link formula gives (latency + bytes / (GB/s x 4 lanes))."""
    import numpy as np

    from servelab.core.request import Request

    rng = np.random.default_rng(args.seed)
    prompt = 4096
    req = [Request(id="alone", prompt_token_ids=tuple(rng.integers(0, 128256, prompt).tolist()), max_tokens=16,
                   arrival_time=0.0, ignore_eos=True)]
    coloc = run("alone: one replica TP4", base + ["cluster.replicas=1"], req)
    rows = []
    for bw in args.links:
        for overlap in (True, False):
            r = run(f"alone: 1P + 1D link {bw:g} GB/s overlap {overlap}", base + DISAGG_8[1] + [
                "cluster.kv_link=inter_node", f"hardware.inter_node_link_gb_s={bw:g}",
                f"cluster.overlap_kv_transfer={str(overlap).lower()}"], req)
            s = r.summary
            rows.append({"link_gb_s": bw, "overlap": overlap, "ttft_ms": s["ttft_ms"]["p50"],
                         "tpot_ms": s["tpot_ms"]["p50"], "kv_bytes": s["kv_transfer_bytes"],
                         "link_ms": 1e3 * s["kv_transfer_s"], "exposed_ms": 1e3 * s["kv_transfer_exposed_s"],
                         "formula_ms": 1e3 * prompt * KV_BYTES_PER_TOKEN / (bw * 1e9 * 4)})
    return {"prompt_tokens": prompt, "colocated_ttft_ms": coloc.summary["ttft_ms"]["p50"],
            "colocated_tpot_ms": coloc.summary["tpot_ms"]["p50"], "rows": rows}


def plot(sweep: dict, pd: dict, links: dict, out: Path) -> None:
    fig, grid = plt.subplots(len(sweep), len(SLOS), figsize=(5 * len(SLOS), 3.6 * len(sweep)), squeeze=False)
    for i, (wname, d) in enumerate(sweep.items()):
        for j, slo in enumerate(SLOS):
            ax = grid[i][j]
            for label in (COLOC_8[0], DISAGG_8[0]):
                pts = [r for r in d["rows"] if r["config"] == label]
                ax.plot([r["rate"] for r in pts], [r[f"goodput_per_gpu_{slo}"] for r in pts], "o-", label=label)
            ax.set(title=f"{wname}: {SLO_TEXT[slo]}", xlabel="request rate (req/s)", ylabel="goodput / GPU (req/s)")
            ax.set_ylim(bottom=0)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
    save_figure(fig, out / "goodput_per_gpu.png")

    fig, rows = plt.subplots(len(links), 2, figsize=(11, 3.8 * len(links)), squeeze=False)
    grid = [[ax for row in rows for ax in row]]
    for i, (wname, d) in enumerate(links.items()):
        for overlap in (True, False):
            pts = sorted((r for r in d["rows"] if r["overlap"] == overlap), key=lambda r: r["link_gb_s"])
            tag = "overlap on" if overlap else "overlap off"
            grid[0][2 * i].plot([r["link_gb_s"] for r in pts], [r["ttft_p50_ms"] / 1e3 for r in pts], "o-", label=f"p50, {tag}")
            grid[0][2 * i].plot([r["link_gb_s"] for r in pts], [r["ttft_p99_ms"] / 1e3 for r in pts], "s--", label=f"p99, {tag}")
            grid[0][2 * i + 1].plot([r["link_gb_s"] for r in pts], [r["goodput_per_gpu_tight_ttft"] for r in pts], "o-", label=tag)
        if d["colocated"]:
            grid[0][2 * i].axhline(d["colocated"]["ttft_p99_ms"] / 1e3, color="grey", ls=":", label="colocated 2 x TP4, p99")
            grid[0][2 * i + 1].axhline(d["colocated"]["goodput_per_gpu_tight_ttft"], color="grey", ls=":", label="colocated 2 x TP4")
        grid[0][2 * i].set(title=f"{wname} at {d['rate']:g} req/s: TTFT, 1P + 1D inter-node",
                           xlabel="link GB/s per GPU (x4 lanes)", ylabel="s", xscale="log")
        grid[0][2 * i + 1].set(title=f"{wname}: goodput / GPU ({SLO_TEXT['tight_ttft']})", xlabel="link GB/s per GPU (x4 lanes)",
                               ylabel="req/s per GPU", xscale="log")
        grid[0][2 * i + 1].set_ylim(bottom=0)
        for ax in grid[0][2 * i:2 * i + 2]:
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
    save_figure(fig, out / "kv_link.png")


def _pair(d: dict, rate: float) -> tuple[dict, dict]:
    at = {r["config"]: r for r in d["rows"] if r["rate"] == rate}
    return at[COLOC_8[0]], at[DISAGG_8[0]]


def winners(d: dict, slo: str) -> list[str]:
    """Per rate: which config had the higher goodput per GPU under ``slo`` (ties within 2%)."""
    out = []
    for rate in sorted({r["rate"] for r in d["rows"]}):
        c, g = _pair(d, rate)
        a, b = c[f"goodput_per_gpu_{slo}"], g[f"goodput_per_gpu_{slo}"]
        out.append("tie" if abs(a - b) <= 0.02 * max(a, b, 1e-9) else ("disagg" if b > a else "coloc"))
    return out


def findings(res: dict) -> list[str]:
    out = []
    for wname, d in res["sweep"].items():
        rates = sorted({r["rate"] for r in d["rows"]})
        hi = rates[-1]
        c, g = _pair(d, hi)
        parts = []
        for slo in SLOS:
            wins = winners(d, slo)
            parts.append(f"{SLO_TEXT[slo]}: " + ", ".join(f"{r:g}/s {w}" for r, w in zip(rates, wins)))
        out.append(f"- **{wname}**: goodput per GPU, who wins at each rate - " + "; ".join(parts) +
                   f". At {hi:g} req/s colocated TTFT p50/p99 {c['ttft_p50_ms'] / 1e3:.3g}/{c['ttft_p99_ms'] / 1e3:.3g} s, "
                   f"TPOT p99 {c['tpot_p99_ms']:.3g} ms; disaggregated {g['ttft_p50_ms'] / 1e3:.3g}/{g['ttft_p99_ms'] / 1e3:.3g} s, "
                   f"TPOT p99 {g['tpot_p99_ms']:.3g} ms (prefill / decode replica busy {g['busy'][0]:.0%} / {g['busy'][1]:.0%}).")
    for wname, d in res["pd"].items():
        best = {slo: max(d["rows"], key=lambda r: r[f"goodput_per_gpu_{slo}"]) for slo in SLOS}
        out.append(f"- **16 GPUs, {wname} at {d['rate']:g} req/s**: the best configuration is " + "; ".join(
            f"{best[s]['config']} under {SLO_TEXT[s]} ({best[s][f'goodput_per_gpu_{s}']:.3g} req/s per GPU)" for s in SLOS) + ".")
    for wname, d in res["links"].items():
        fast = max(d["rows"], key=lambda r: (r["link_gb_s"], r["overlap"]))
        slow_on = min((r for r in d["rows"] if r["overlap"]), key=lambda r: r["link_gb_s"])
        slow_off = min((r for r in d["rows"] if not r["overlap"]), key=lambda r: r["link_gb_s"])
        out.append(f"- **link, {wname} at {d['rate']:g} req/s**: the transfer's exposed time per request grows from "
                   f"{fast['kv_exposed_ms_mean']:.3g} ms at {fast['link_gb_s']:g} GB/s (overlap on) to "
                   f"{slow_on['kv_exposed_ms_mean']:.3g} ms (on) / {slow_off['kv_exposed_ms_mean']:.3g} ms (off) at "
                   f"{slow_on['link_gb_s']:g} GB/s; TTFT p99 {fast['ttft_p99_ms'] / 1e3:.3g} s -> "
                   f"{slow_on['ttft_p99_ms'] / 1e3:.3g} s (on) / {slow_off['ttft_p99_ms'] / 1e3:.3g} s (off); goodput per GPU "
                   f"({SLO_TEXT['loose']}) {fast['goodput_per_gpu_loose']:.3g} -> {slow_on['goodput_per_gpu_loose']:.3g} (on) / "
                   f"{slow_off['goodput_per_gpu_loose']:.3g} (off)"
                   + (f", colocated {d['colocated']['goodput_per_gpu_loose']:.3g}" if d["colocated"] else "")
                   + f"; ({SLO_TEXT['tight_ttft']}) {fast['goodput_per_gpu_tight_ttft']:.3g} -> "
                   f"{slow_on['goodput_per_gpu_tight_ttft']:.3g} (on) / {slow_off['goodput_per_gpu_tight_ttft']:.3g} (off)"
                   + (f", colocated {d['colocated']['goodput_per_gpu_tight_ttft']:.3g}." if d["colocated"] else "."))
    return out


def headline(res: dict) -> str:
    parts = []
    for wname, d in res["sweep"].items():
        hi = max(r["rate"] for r in d["rows"])
        c, g = _pair(d, hi)
        parts.append(f"{wname} at {hi:g}/s: {g['goodput_per_gpu_tight_tpot']:.3g} vs {c['goodput_per_gpu_tight_tpot']:.3g} "
                     f"(TPOT <= 40 ms), {g['goodput_per_gpu_loose']:.3g} vs {c['goodput_per_gpu_loose']:.3g} (TPOT <= 100 ms)")
    return "8 GPUs, goodput per GPU (req/s) disaggregated 1P + 1D vs colocated 2 x TP4 at the highest rate: " + "; ".join(parts) + "."


def page(args, res: dict, total_wall: float) -> str:
    lines = [
        "## (b) Colocated vs disaggregated",
        "",
        "**Question.** DistServe and Splitwise run prompts and decodes on separate GPUs so a long prefill never "
        "stalls a decode step, and pay with a KV transfer and a prefill pool that must absorb every prompt alone. "
        "At an equal GPU count, where does that pay (goodput per GPU under TTFT and TPOT SLOs), and how slow can "
        "the link get?",
        "",
        f"**Setup.** Llama-3-70B, TP 4 per replica on H100, {time_model_note(res['time_model'], 'sim')}, virtual clock, "
        "`max_num_seqs=256` on every replica (prefill and decode pools alike), chunked prefill (2048-token budget), "
        "`router=least_outstanding`. Disaggregated: a prefill replica computes the prompt and first token, the "
        "decode replica allocates the blocks and pulls the KV (TTFT includes the transfer); on one 8-GPU node over "
        "NVLink, overlapped with the prefill, unless stated. Rates are set by time-scaling each workload; goodput per "
        "GPU = requests meeting both targets / duration / GPUs, for three SLO pairs from the same runs: "
        + "; ".join(f"`{k}` {v}" for k, v in SLO_TEXT.items()) + ".",
        "",
        "Read with care: every replica has the same 2048-token step budget (a prefill replica gets no larger one); "
        "goodput divides by the run's duration, which runs to the last token, so the drain after the last arrival "
        "lowers it a little at every rate alike; the Azure code trace arrives in bursts (hundreds of requests within "
        "seconds), so its TTFT tails are queueing behind bursts, not steady load.",
        "",
        f"Command: `python experiments/cluster_serving/run.py --update-readme --only disagg`. {machine_line(total_wall)}",
        "",
        "### 8 GPUs: 2 x TP4 colocated vs 1 prefill + 1 decode, by rate",
        "",
    ]
    for wname, d in res["sweep"].items():
        st = d["stats"]
        lines += [f"**{wname}**: {d['label']}; prompt mean {st['prompt_mean']:.0f} tokens (p99 {st['prompt_p99']:.0f}), "
                  f"output mean {st['output_mean']:.0f}.", "",
                  table(["rate req/s", "config", "output tok/s", "TTFT p50 s", "TTFT p99 s", "TPOT p50 ms", "TPOT p99 ms",
                         "goodput/GPU loose", "goodput/GPU tight TPOT", "goodput/GPU tight TTFT", "busy per replica"],
                        [[r["rate"], r["config"], r["output_tok_s"], r["ttft_p50_ms"] / 1e3, r["ttft_p99_ms"] / 1e3,
                          r["tpot_p50_ms"], r["tpot_p99_ms"], r["goodput_per_gpu_loose"], r["goodput_per_gpu_tight_tpot"],
                          r["goodput_per_gpu_tight_ttft"], " / ".join(f"{b:.0%}" for b in r["busy"])] for r in d["rows"]]), ""]
    lines += ["![goodput per GPU](disagg/goodput_per_gpu.png)", "", "### 16 GPUs: the P:D split", ""]
    for wname, d in res["pd"].items():
        lines += [f"**{wname}** at {d['rate']:g} req/s:", "",
                  table(["config", "TTFT p50 s", "TTFT p99 s", "TPOT p50 ms", "TPOT p99 ms", "goodput/GPU loose",
                         "goodput/GPU tight TPOT", "goodput/GPU tight TTFT", "busy per replica"],
                        [[r["config"], r["ttft_p50_ms"] / 1e3, r["ttft_p99_ms"] / 1e3, r["tpot_p50_ms"], r["tpot_p99_ms"],
                          r["goodput_per_gpu_loose"], r["goodput_per_gpu_tight_tpot"], r["goodput_per_gpu_tight_ttft"],
                          " / ".join(f"{b:.0%}" for b in r["busy"])] for r in d["rows"]]), ""]
    lines += ["### The KV link", "",
              "1 prefill + 1 decode replica on different nodes (`cluster.kv_link=inter_node`), "
              "`hardware.inter_node_link_gb_s` per GPU, 4 lanes (TP 4 each side); Llama-3-70B's KV is "
              f"{KV_BYTES_PER_TOKEN:,} bytes per token (bf16).", ""]
    for wname, d in res["links"].items():
        lines += [f"**{wname}** at {d['rate']:g} req/s" + (
                  f" (colocated 2 x TP4 at this rate: TTFT p50/p99 {d['colocated']['ttft_p50_ms'] / 1e3:.3g}/"
                  f"{d['colocated']['ttft_p99_ms'] / 1e3:.3g} s, goodput/GPU loose {d['colocated']['goodput_per_gpu_loose']:.3g})"
                  if d["colocated"] else "") + ":", "",
                  table(["link GB/s per GPU", "overlap", "mean link time ms", "mean exposed ms", "TTFT p50 s", "TTFT p99 s",
                         "TPOT p99 ms", "goodput/GPU loose", "goodput/GPU tight TPOT", "goodput/GPU tight TTFT"],
                        [[r["link_gb_s"], "on" if r["overlap"] else "off", r["kv_transfer_ms_mean"], r["kv_exposed_ms_mean"],
                          r["ttft_p50_ms"] / 1e3, r["ttft_p99_ms"] / 1e3, r["tpot_p99_ms"], r["goodput_per_gpu_loose"],
                          r["goodput_per_gpu_tight_tpot"], r["goodput_per_gpu_tight_ttft"]] for r in d["rows"]]), ""]
    a = res["alone"]
    lines += [f"One request alone ({a['prompt_tokens']}-token prompt, 16 output tokens): colocated on one TP4 replica "
              f"TTFT {a['colocated_ttft_ms']:.4g} ms, TPOT {a['colocated_tpot_ms']:.3g} ms. Disaggregated, by link "
              "(the formula column: bytes / (GB/s x 4 lanes), without the link's latency):", "",
              table(["link GB/s per GPU", "overlap", "TTFT ms", "TTFT - colocated ms", "exposed ms", "link time ms",
                     "formula ms", "TPOT ms"],
                    [[r["link_gb_s"], "on" if r["overlap"] else "off", r["ttft_ms"], r["ttft_ms"] - a["colocated_ttft_ms"],
                      r["exposed_ms"], r["link_ms"], r["formula_ms"], r["tpot_ms"]] for r in a["rows"]]), "",
              "![KV link](disagg/kv_link.png)", "", "### What it shows", "", *findings(res), ""]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
