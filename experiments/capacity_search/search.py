"""Capacity search: for each serving stack, the highest request rate whose p99 TTFT and p99 TPOT
stay within the SLOs, found by bisection on the rate over simulator runs.

    python experiments/capacity_search/search.py                      # the README's table (~10 min)
    python experiments/capacity_search/search.py --tp 4 --override backend.gpu_memory_utilization=0.6 \
        --name results_memory_tight                                   # its memory-tight table
    python experiments/capacity_search/search.py --tp 8 --schedulers fcfs --chunked on --preemption recompute
    python experiments/capacity_search/analyze.py                     # README.md and the plot

The workload is a slice of the Azure LLM inference trace (conversation), replayed with its own
arrival pattern compressed or stretched: ``workload.time_scale = native rate / rate``, so every
probe sees the same requests in the same order, only closer together or further apart. Each probe
is one ``backend=sim`` run on the virtual clock with ``time_model=auto`` (``--time-model``; deterministic: the
same probe gives the same figures on any machine, whatever its load). Runs go through the Python
API in this one process (no Hydra start-up per probe); the trace is read once.

A rate *passes* when every request finishes (none rejected) and p99 TTFT <= --ttft-ms and p99
TPOT <= --tpot-ms. The search doubles (or halves) the rate from the slice's own rate until it
brackets the boundary, then bisects until the bracket is within --rel-tol. It assumes that
passing is monotone in the rate (it is for these stacks in practice; every probe is recorded in
the results so a non-monotone case shows).

Writes ``<name>.json`` (settings, every probe, the summary at the found rate) and ``<name>.csv``
(one row per stack and TP degree) into --out: by default a fresh folder
``multirun/capacity_search/<date>_<time>/`` (``analyze.py`` reads the newest one), never the committed
results beside this script (``--out experiments/capacity_search`` replaces those on purpose).
The trace is a packaged trace's name (``azure_conv``, the default) or a CSV file.
"""

from __future__ import annotations

import argparse
import csv
import json
import platform
import sys
import tempfile
import time
from datetime import datetime
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
DEFAULT_TRACE = "azure_conv"  # the packaged Azure conversation trace (servelab.core.packaged.PACKAGED_TRACES)
RUNS = REPO / "multirun" / "capacity_search"  # one fresh folder per search by default


def fresh_run_dir() -> Path:
    """``multirun/capacity_search/<date>_<time>`` (a suffix if that second is taken): never existing results."""
    base = RUNS / datetime.now().strftime("%Y-%m-%d_%H-%M-%S")
    out, n = base, 1
    while out.exists():
        out, n = base.with_name(f"{base.name}-{n}"), n + 1
    return out


# ---------------------------------------------------------------- the bisection (no servelab here)

@dataclass
class Probe:
    rate: float
    ok: bool
    info: dict = field(default_factory=dict)


@dataclass
class SearchResult:
    """``max_rate``: the highest rate that passed (None: not even ``min_rate``); ``fail_rate``: the
    lowest that failed above it (None: even ``max_rate_limit`` passed)."""

    max_rate: float | None
    fail_rate: float | None
    probes: list[Probe]


def bisect_max_rate(passes: Callable[[float], tuple[bool, dict]], start: float, *, rel_tol: float = 0.02,
                    min_rate: float | None = None, max_rate: float | None = None, max_probes: int = 24) -> SearchResult:
    """The highest rate for which ``passes(rate)[0]`` holds, to within ``rel_tol`` of itself.

    From ``start`` the rate doubles while it passes (halves while it fails) until the boundary is
    bracketed by [lo passes, hi fails], then the bracket is bisected until (hi - lo) / lo <= rel_tol.
    ``min_rate`` / ``max_rate`` bound the doubling/halving (default start/64 and start*64);
    ``max_probes`` bounds the number of runs.
    """
    if start <= 0 or rel_tol <= 0:
        raise ValueError("start and rel_tol must be > 0")
    min_rate = start / 64 if min_rate is None else min_rate
    max_rate = start * 64 if max_rate is None else max_rate
    probes: list[Probe] = []

    def probe(rate: float) -> bool:
        ok, info = passes(rate)
        probes.append(Probe(rate, bool(ok), info))
        return bool(ok)

    lo = hi = None
    rate = start
    if probe(rate):
        lo = rate
        while hi is None and len(probes) < max_probes:
            if lo >= max_rate:
                return SearchResult(lo, None, probes)
            rate = min(lo * 2, max_rate)
            if probe(rate):
                lo = rate
            else:
                hi = rate
    else:
        hi = rate
        while lo is None and len(probes) < max_probes:
            if hi <= min_rate:
                return SearchResult(None, hi, probes)
            rate = max(hi / 2, min_rate)
            if probe(rate):
                lo = rate
            else:
                hi = rate
    while lo is not None and hi is not None and (hi - lo) / lo > rel_tol and len(probes) < max_probes:
        mid = (lo + hi) / 2
        if probe(mid):
            lo = mid
        else:
            hi = mid
    return SearchResult(lo, hi, probes)


# ---------------------------------------------------------------- stacks and runs

@dataclass(frozen=True)
class StackSpec:
    scheduler: str
    chunked_prefill: bool
    preemption: str

    @property
    def label(self) -> str:
        return f"{self.scheduler} / {'chunked' if self.chunked_prefill else 'whole prompts'} / {self.preemption}"

    def overrides(self, args: argparse.Namespace) -> list[str]:
        budget = args.chunk_budget if self.chunked_prefill else args.max_model_len
        ov = [f"scheduler={self.scheduler}", f"chunked_prefill={str(self.chunked_prefill).lower()}",
              f"max_num_batched_tokens={budget}", f"preemption={self.preemption}"]
        if self.preemption in ("swap", "adaptive"):
            ov.append(f"backend.swap_space_gb={args.swap_space_gb}")
        return ov


def base_overrides(args: argparse.Namespace, tp: int) -> list[str]:
    return ["backend=sim", "clock=virtual", f"time_model={args.time_model}", f"hardware={args.hardware}", f"model={args.model}",
            f"tensor_parallel_size={tp}", f"max_model_len={args.max_model_len}", f"max_num_seqs={args.max_num_seqs}",
            "workload=trace", f"workload.path={args.trace}", f"workload.num_requests={args.num_requests}",
            f"workload.start_row={args.start_row}", f"slo.ttft_ms={args.ttft_ms}", f"slo.tpot_ms={args.tpot_ms}",
            *args.override]


def slice_rate(requests) -> tuple[float, float]:
    """The slice's own mean arrival rate (req/s over the span of its arrivals) and that span (s)."""
    arrivals = sorted(r.arrival_time for r in requests)
    span = arrivals[-1] - arrivals[0]
    if len(arrivals) < 2 or span <= 0:
        raise SystemExit("the trace slice needs at least two requests with distinct arrival times")
    return (len(arrivals) - 1) / span, span


def run_at_rate(cfg, requests, native_rate: float, rate: float, ttft_ms: float, tpot_ms: float) -> tuple[bool, dict]:
    """One sim run of ``requests`` at ``rate`` req/s; whether it meets the SLOs, and its figures."""
    from omegaconf import open_dict

    from servelab.run.session import run_job

    with open_dict(cfg):
        cfg.workload.time_scale = native_rate / rate
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="capacity-") as out:
        result = run_job(cfg, out, requests=requests)
    wall = time.perf_counter() - t0
    s = result.summary
    complete = s["status"] == "completed" and s["num_finished"] == s["num_requests"] and not s["num_rejected"]
    ttft99, tpot99 = s["ttft_ms"]["p99"], s["tpot_ms"]["p99"]
    ttft_ok = ttft99 is not None and ttft99 <= ttft_ms
    tpot_ok = tpot99 is None or tpot99 <= tpot_ms
    ok = complete and ttft_ok and tpot_ok
    failed_on = [name for name, good in (("unfinished", complete), ("TTFT", ttft_ok), ("TPOT", tpot_ok)) if not good]
    info = {"time_scale": cfg.workload.time_scale, "wall_s": round(wall, 3), "ttft_p99_ms": ttft99,
            "tpot_p99_ms": tpot99, "complete": complete, "failed_on": "+".join(failed_on) or None}
    return ok, {**info, "summary": s}


KEEP = ("duration_s", "output_throughput_tok_s", "request_throughput_req_s", "output_tokens", "prompt_tokens",
        "ttft_ms", "tpot_ms", "e2e_ms", "slo_attainment", "num_preemptions", "num_preemptions_by_kind",
        "kv_utilization_mean", "kv_utilization_max", "max_concurrent_requests", "num_kv_blocks", "num_steps",
        "swap_out_bytes", "recomputed_tokens", "leaked_blocks", "clock", "time_model", "hardware",
        "tensor_parallel_size", "sim_weight_bytes_per_rank", "sim_kv_pool_bytes_per_rank")


def search_stack(args, tp: int, spec: StackSpec, requests, native_rate: float) -> dict:
    from servelab.api import compose

    cfg = compose(base_overrides(args, tp) + spec.overrides(args), logger="none", progress=False)
    t0 = time.perf_counter()
    result = bisect_max_rate(lambda r: run_at_rate(cfg, requests, native_rate, r, args.ttft_ms, args.tpot_ms),
                             args.start_rate or native_rate, rel_tol=args.rel_tol, max_probes=args.max_probes)
    wall = time.perf_counter() - t0
    best = next((p for p in reversed(result.probes) if p.ok and p.rate == result.max_rate), None)
    first_fail = next((p for p in reversed(result.probes) if not p.ok and p.rate == result.fail_rate), None)
    summary = {k: best.info["summary"].get(k) for k in KEEP} if best else None
    row = {"tp": tp, "stack": spec.label, **asdict(spec), "max_rate_req_s": result.max_rate,
           "fail_rate_req_s": result.fail_rate,
           "fails_on": first_fail.info["failed_on"] if first_fail else None, "search_wall_s": round(wall, 2), "num_probes": len(result.probes),
           "probes": [{"rate": p.rate, "ok": p.ok, **{k: v for k, v in p.info.items() if k != "summary"}}
                      for p in result.probes],
           "at_max_rate": summary}
    if summary:
        prompt_out = summary["output_tokens"] + summary["prompt_tokens"]
        row.update(output_tok_s=summary["output_throughput_tok_s"],
                   output_tok_s_per_gpu=summary["output_throughput_tok_s"] / tp,
                   total_tok_s_per_gpu=prompt_out / summary["duration_s"] / tp,
                   ttft_p99_ms=summary["ttft_ms"]["p99"], tpot_p99_ms=summary["tpot_ms"]["p99"],
                   num_preemptions=summary["num_preemptions"], kv_utilization_max=summary["kv_utilization_max"])
    return row


CSV_COLUMNS = ("tp", "scheduler", "chunked_prefill", "preemption", "max_rate_req_s", "fail_rate_req_s", "fails_on",
               "output_tok_s", "output_tok_s_per_gpu", "total_tok_s_per_gpu", "ttft_p99_ms", "tpot_p99_ms",
               "num_preemptions", "kv_utilization_max", "num_probes", "search_wall_s")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trace", default=DEFAULT_TRACE,
                   help="a packaged trace's name or an Azure-format CSV trace (default: %(default)s)")
    p.add_argument("--num-requests", type=int, default=2000,
                   help="trace slice: this many rows from --start-row (2000 = the first ~7 minutes); 0 = all")
    p.add_argument("--start-row", type=int, default=0)
    p.add_argument("--ttft-ms", type=float, default=2000.0, help="p99 TTFT SLO (ms)")
    p.add_argument("--tpot-ms", type=float, default=100.0, help="p99 TPOT SLO (ms)")
    p.add_argument("--tp", type=int, nargs="+", default=[8, 4], help="tensor parallel degrees")
    p.add_argument("--schedulers", nargs="+", default=["fcfs", "priority", "slo_aware"])
    p.add_argument("--chunked", nargs="+", choices=["on", "off"], default=["on", "off"])
    p.add_argument("--preemption", nargs="+", default=["recompute", "swap"])
    p.add_argument("--time-model", default="auto",
                   help="auto (op tables where measured, else the calibrated roofline), op_profile, "
                        "calibrated_roofline or roofline (default: %(default)s)")
    p.add_argument("--hardware", default="h100")
    p.add_argument("--model", default="llama3_70b")
    p.add_argument("--max-num-seqs", type=int, default=256, help="seats (vLLM's default: 256)")
    p.add_argument("--chunk-budget", type=int, default=2048,
                   help="max_num_batched_tokens with chunked prefill (without: --max-model-len)")
    p.add_argument("--max-model-len", type=int, default=16384)
    p.add_argument("--swap-space-gb", type=float, default=4.0, help="host swap pool per rank, GiB (vLLM's default: 4)")
    p.add_argument("--rel-tol", type=float, default=0.02, help="stop when (fail - pass) / pass <= this")
    p.add_argument("--max-probes", type=int, default=16, help="runs per search at most")
    p.add_argument("--start-rate", type=float, default=None, help="first rate probed (default: the slice's own)")
    p.add_argument("--override", nargs="*", default=[], help="extra Hydra overrides for every run")
    p.add_argument("--out", default=None, help="folder for the results (default: a fresh "
                   "multirun/capacity_search/<date>_<time>/; the committed ones: --out experiments/capacity_search)")
    p.add_argument("--name", default="results", help="file name stem: <out>/<name>.json and .csv (default: %(default)s)")
    args = p.parse_args(argv)
    if args.num_requests == 0:
        args.num_requests = "null"
    if args.out is None:
        args.out = str(fresh_run_dir())
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    from servelab.api import compose
    from servelab.core.packaged import trace_path
    from servelab.assemble.stack import build_stack
    from servelab.workloads.build import build_requests

    trace_path(args.trace, "--trace")  # a missing trace: one line (see __main__), before any run

    stacks = [StackSpec(s, c == "on", p) for s in args.schedulers for c in args.chunked for p in args.preemption]
    t_start = time.perf_counter()
    rows, env = [], {}
    for tp in args.tp:
        cfg = compose(base_overrides(args, tp), logger="none", progress=False)
        stack = build_stack(cfg)
        requests = build_requests(cfg.workload, stack.executor.spec.vocab_size, stack.limits.max_model_len)
        stack.executor.shutdown()
        native, span = slice_rate(requests)
        env[tp] = {"native_rate_req_s": native, "span_s": span, "num_requests": len(requests)}
        print(f"TP {tp}: {len(requests)} requests over {span:.0f} s of trace ({native:.2f} req/s)", flush=True)
        for spec in stacks:
            row = search_stack(args, tp, spec, requests, native)
            rows.append(row)
            print(f"  {spec.label:40s} max {row['max_rate_req_s'] or 0:7.2f} req/s (fails at "
                  f"{row['fail_rate_req_s'] or float('nan'):.2f}); {row['num_probes']} runs, {row['search_wall_s']:.0f} s",
                  flush=True)
    total = time.perf_counter() - t_start
    results = {
        "settings": {k: v for k, v in vars(args).items() if k not in ("out", "name")},
        "trace_slices": env,
        "clock": "virtual", "time_model": args.time_model,
        "time_model_config": rows[0]["at_max_rate"]["time_model"] if rows and rows[0]["at_max_rate"] else None,
        "total_wall_s": round(total, 1),
        "machine": f"{platform.node()}, {platform.processor() or platform.machine()}, Python {platform.python_version()}",
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "rows": rows,
    }
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{args.name}.json").write_text(json.dumps(results, indent=1, default=str) + "\n")
    with (out / f"{args.name}.csv").open("w", newline="") as fh:
        w = csv.DictWriter(fh, CSV_COLUMNS, extrasaction="ignore")
        w.writeheader()
        for row in rows:
            w.writerow({k: (f"{v:.4g}" if isinstance(v, float) else v) for k, v in row.items() if k in CSV_COLUMNS})
    print(f"{len(rows)} searches, {sum(r['num_probes'] for r in rows)} sim runs in {total:.0f} s; "
          f"wrote {out / args.name}.json and .csv", flush=True)
    return results


if __name__ == "__main__":
    import logging

    from servelab.core.errors import ServelabError

    logging.getLogger("servelab").setLevel(logging.WARNING)  # not every run's start-up lines
    try:
        main(sys.argv[1:])
    except ServelabError as exc:
        sys.exit(f"search.py: error: {exc}")
