"""(c) Capacity: how many replicas a target request rate needs under the SLOs: the smallest N with
SLO attainment >= ``--target-attainment`` (both TTFT and TPOT), colocated TP 4 or TP 8 replicas, and
the disaggregated (P, D) counterpart with TP 4 pools.

    python experiments/cluster_serving/capacity.py                  # multirun/cluster_serving/<time>/capacity/
    python experiments/cluster_serving/capacity.py --update-readme  # experiments/cluster_serving/capacity/ + README

The first ``--requests`` rows of the Azure conversation trace, time-scaled to each rate of
``--rates``, ``router=least_outstanding``. Colocated: N starts at a guess (rate / ``--per-replica-*``)
and walks down while the target is met, up while it is not. Disaggregated: P + D = G starts one below the
colocated TP 4 count; at each G, P starts at G/2 and moves toward the pool the misses point at (more
prefill when TTFT misses dominate, more decode when TPOT misses do) until it meets the target or turns
round; then G + 1.
"""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import (
    SIM_70B_TP4, SLO_TEXT, SLOS, describe, figures, finish, machine_line, native_rate, parse_args, plt, quiet, run,
    save_figure, slo_overrides, table, time_model_note, trace_requests, write_csv, write_json,
)

NAME = "capacity"


def add_arguments(p) -> None:
    p.add_argument("--quick", action="store_true", help="a tiny version (the tests)")
    p.add_argument("--requests", type=int, default=3000)
    p.add_argument("--rates", type=float, nargs="+", default=[10, 20, 40])
    p.add_argument("--target-attainment", type=float, default=0.9)
    p.add_argument("--slo", default="loose", choices=sorted(SLOS))
    p.add_argument("--per-replica-tp4", type=float, default=4.5, help="req/s a TP 4 replica is guessed to take")
    p.add_argument("--per-replica-tp8", type=float, default=9.0)
    p.add_argument("--max-replicas", type=int, default=24)
    p.add_argument("--no-disagg", action="store_true")
    p.add_argument("--seed", type=int, default=0)


def quick(args) -> None:
    if args.quick:
        args.requests, args.rates = 80, [6]


def attainments(r) -> tuple[float, float]:
    """(TTFT attainment, TPOT attainment) under the chosen SLO from the records (finished only)."""
    ttft_t, tpot_t = SLOS[r.extra["slo"]]
    done = [rec for rec in r.records if rec.get("finish_reason") in ("stop", "length")]
    if not done:
        return 0.0, 0.0
    a = sum(rec["ttft_ms"] <= ttft_t for rec in done) / len(done)
    b = sum(rec.get("tpot_ms") is None or rec["tpot_ms"] <= tpot_t for rec in done) / len(done)
    return a, b


class Searcher:
    def __init__(self, args, requests, base):
        self.args, self.requests, self.base = args, requests, base
        self.native = native_rate(requests)
        self.tried: list[dict] = []
        self.time_model = None

    def trial(self, rate: float, kind: str, tp: int, n: int = 0, p: int = 0, d: int = 0) -> dict:
        for t in self.tried:
            if (t["rate"], t["kind"], t["tp"], t["replicas"], t["prefill"], t["decode"]) == (rate, kind, tp, n, p, d):
                return t
        shape = [f"cluster.replicas={n}"] if kind == "colocated" else [f"cluster.prefill_replicas={p}",
                                                                       f"cluster.decode_replicas={d}"]
        label = f"{rate:g}/s {kind} TP{tp} " + (f"N={n}" if kind == "colocated" else f"P={p} D={d}")
        r = run(label, self.base + [f"tensor_parallel_size={tp}"] + shape + [
            f"workload.time_scale={self.native / rate:.6g}"], self.requests)
        self.time_model = self.time_model or r.time_model
        r.extra["slo"] = self.args.slo
        f = figures(r)
        a_ttft, a_tpot = attainments(r)
        row = {"rate": rate, "kind": kind, "tp": tp, "replicas": n or p + d, "prefill": p, "decode": d,
               "gpus": f["num_gpus"], "attainment": f[f"att_{self.args.slo}"], "ttft_attainment": a_ttft,
               "tpot_attainment": a_tpot, "ttft_p99_ms": f["ttft_p99_ms"], "tpot_p99_ms": f["tpot_p99_ms"],
               "goodput_req_s": f[f"goodput_{self.args.slo}"], "busy": f["busy"]}
        row["ok"] = row["attainment"] >= self.args.target_attainment
        self.tried.append(row)
        return row

    def colocated(self, rate: float, tp: int, per_replica: float) -> dict | None:
        n = max(1, math.ceil(rate / per_replica))
        row = self.trial(rate, "colocated", tp, n=n)
        if row["ok"]:
            while n > 1:
                lower = self.trial(rate, "colocated", tp, n=n - 1)
                if not lower["ok"]:
                    break
                n, row = n - 1, lower
            return row
        while n < self.args.max_replicas:
            n += 1
            row = self.trial(rate, "colocated", tp, n=n)
            if row["ok"]:
                return row
        return None

    def disaggregated(self, rate: float, start: int) -> dict | None:
        g = max(2, start)
        while g <= self.args.max_replicas:
            p = max(1, min(g - 1, round(g / 2)))
            direction = 0
            while True:
                row = self.trial(rate, "disaggregated", 4, p=p, d=g - p)
                if row["ok"]:
                    return row
                step = 1 if row["ttft_attainment"] < row["tpot_attainment"] else -1  # more prefill, or more decode
                if direction and step != direction:
                    break  # turned round: no split of g works
                direction = step
                p += step
                if not 1 <= p <= g - 1:
                    break
            g += 1
        return None


def main(argv=None) -> dict:
    args = parse_args(__doc__, NAME, add_arguments, argv)
    quick(args)
    quiet()
    t_start = time.perf_counter()
    requests = trace_requests("azure_conv", args.requests, args.seed)
    stats = describe(requests)
    base = [o for o in SIM_70B_TP4 if not o.startswith("tensor_parallel_size=")] + slo_overrides(args.slo) + [
        "workload=trace", "workload.path=azure_conv", "router=least_outstanding"]
    s = Searcher(args, requests, base)
    found = []
    for rate in args.rates:
        print(f"capacity: {rate:g} req/s", flush=True)
        tp4 = s.colocated(rate, 4, args.per_replica_tp4)
        tp8 = s.colocated(rate, 8, args.per_replica_tp8)
        dis = None
        if not args.no_disagg:
            dis = s.disaggregated(rate, (tp4["replicas"] - 1) if tp4 else 2)
        found.append({"rate": rate, "colocated_tp4": tp4, "colocated_tp8": tp8, "disaggregated_tp4": dis})
    total = time.perf_counter() - t_start
    out = args.out_dir
    plot(found, out)
    results = {"settings": {k: v for k, v in vars(args).items() if k != "out_dir"}, "overrides": base,
               "time_model": s.time_model, "stats": stats, "found": found, "tried": s.tried,
               "total_wall_s": round(total, 1), "date": time.strftime("%Y-%m-%d %H:%M")}
    write_json(out / "results.json", results)
    keys = ["rate", "kind", "tp", "replicas", "prefill", "decode", "gpus", "attainment", "ttft_attainment",
            "tpot_attainment", "ttft_p99_ms", "tpot_p99_ms", "goodput_req_s", "ok"]
    write_csv(out / "results.csv", keys, [[row[k] for k in keys] for row in s.tried])
    finish(args, NAME, page(args, results, total), headline(results))
    return results


LABELS = {"colocated_tp4": "colocated TP4", "colocated_tp8": "colocated TP8", "disaggregated_tp4": "disaggregated TP4 (P + D)"}


def plot(found: list[dict], out: Path) -> None:
    fig, ax = plt.subplots(figsize=(6, 4))
    for key, label in LABELS.items():
        pts = [(f["rate"], f[key]["gpus"]) for f in found if f.get(key)]
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=label)
    ax.set(title="GPUs needed (SLO attainment >= target)", xlabel="target rate (req/s)", ylabel="GPUs")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    save_figure(fig, out / "capacity.png")


def _cfg(row: dict | None) -> str:
    if row is None:
        return "not found"
    if row["kind"] == "colocated":
        return f"{row['replicas']} x TP{row['tp']} ({row['gpus']} GPUs)"
    return f"{row['prefill']}P + {row['decode']}D x TP4 ({row['gpus']} GPUs)"


def headline(res: dict) -> str:
    t = res["settings"]["target_attainment"]
    parts = [f"{f['rate']:g} req/s: " + ", ".join(f"{_cfg(f[k])}" for k in LABELS if k in f and (f[k] or k != "disaggregated_tp4"
                                                                                                   or not res['settings']['no_disagg']))
             for f in res["found"]]
    return (f"Azure conversation, {SLO_TEXT[res['settings']['slo']]}, attainment >= {t:.0%}, smallest cluster "
            "(colocated TP4, colocated TP8, disaggregated TP4): " + "; ".join(parts) + ".")


def page(args, res: dict, total_wall: float) -> str:
    st = res["stats"]
    lines = [
        "## (c) Capacity",
        "",
        f"**Question.** How many replicas does a target request rate need, so that at least "
        f"{args.target_attainment:.0%} of requests meet {SLO_TEXT[args.slo]}? TP 4 or TP 8 replicas, and prefill/decode pools?",
        "",
        f"**Setup.** Llama-3-70B on H100, {time_model_note(res['time_model'], 'sim')}, virtual clock, `max_num_seqs=256`, "
        f"chunked prefill, `router=least_outstanding`; the first {st['num_requests']} rows of the Azure conversation "
        f"trace (prompt mean {st['prompt_mean']:.0f} tokens, output mean {st['output_mean']:.0f}), time-scaled to each "
        "rate. SLO attainment counts a request that met both targets (summary.json's `slo_attainment`). Search: "
        "colocated N from a guess, down while the target holds, up while it does not; disaggregated (TP 4 pools) "
        "from one replica fewer than the colocated TP 4 answer, the split moved toward the pool the misses point at "
        "(TTFT misses: more prefill; TPOT misses: more decode).",
        "",
        f"Command: `python experiments/cluster_serving/run.py --update-readme --only capacity`. {machine_line(total_wall)}",
        "",
        table(["target req/s"] + list(LABELS.values()),
              [[f["rate"]] + [_cfg(f[k]) for k in LABELS] for f in res["found"]]),
        "",
        "Every configuration tried:",
        "",
        table(["rate", "configuration", "GPUs", "SLO attainment", "TTFT attainment", "TPOT attainment", "TTFT p99 s",
               "TPOT p99 ms", "meets target"],
              [[r["rate"], _cfg(r), r["gpus"], f"{r['attainment']:.1%}", f"{r['ttft_attainment']:.1%}",
                f"{r['tpot_attainment']:.1%}", r["ttft_p99_ms"] / 1e3, r["tpot_p99_ms"], "yes" if r["ok"] else "no"]
               for r in sorted(res["tried"], key=lambda r: (r["rate"], r["kind"], r["tp"], r["gpus"], r["prefill"]))]),
        "",
        "### What it shows",
        "",
    ]
    for f in res["found"]:
        c4, c8, dz = f["colocated_tp4"], f["colocated_tp8"], f.get("disaggregated_tp4")
        s = f"- **{f['rate']:g} req/s**: colocated TP4 needs {_cfg(c4)}, TP8 {_cfg(c8)}"
        if c4 and c8:
            s += (f" ({'fewer' if c8['gpus'] < c4['gpus'] else 'more' if c8['gpus'] > c4['gpus'] else 'as many'} GPUs "
                  "with TP8)")
        if not args.no_disagg:
            s += f"; disaggregated {_cfg(dz)}"
            if dz and c4:
                s += f" ({dz['gpus'] - c4['gpus']:+d} GPUs against colocated TP4)"
        lines.append(s + ".")
    lines += ["", "![capacity](capacity/capacity.png)", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
