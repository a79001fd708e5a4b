"""How fast and how lean is the simulator? Wall time, steps and peak RSS of ``backend=sim`` runs.

    python benchmarks/sim_speed.py                      # every case, fast-forward on (the default)
    python benchmarks/sim_speed.py trace --both 3       # fast-forward on and off, interleaved, 3 pairs
    python benchmarks/sim_speed.py azure_1m             # the million-request case
    python benchmarks/sim_speed.py --startup            # start-up: imports, composing, the workload, the stack
    python benchmarks/sim_speed.py --profile trace      # where the time goes (cProfile, top functions)

Each case runs in its own process (peak RSS is per process). The trace case is the issue's target:
Llama-3.1-70B on 8 x H100, slo_aware, the 19,366 requests of the Azure conversation trace at their
own arrival times; ``trace_8_replicas`` is the same trace eight times as fast on eight such replicas;
``azure_1m`` is a million requests resampled from that trace (lengths and arrival gaps drawn with
replacement: ``workload.sample=resample``), made lazily. ``ff`` is the share of steps the
fast-forward ran without asking the policies (``sim.fast_forward``; ``servelab.engine.fast_forward``).

Figures (docs/simulator.md has the table and the machine): see the section "How fast" there.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

TRACE = "azure_conv"  # the packaged Azure conversation trace (servelab.core.packaged.PACKAGED_TRACES)
CASES = {
    "azure_1m": ["backend=sim", "hardware=h100", "model=llama3_70b", "tensor_parallel_size=8", "workload=trace",
                 f"workload.path={TRACE}", "workload.sample=resample", "workload.num_requests=1000000",
                 "scheduler=slo_aware"],
    "trace": ["backend=sim", "hardware=h100", "model=llama3_70b", "tensor_parallel_size=8", "workload=trace",
              f"workload.path={TRACE}", "scheduler=slo_aware"],
    # the same trace eight times as fast on eight such replicas behind round_robin (each replica sees the trace's load)
    "trace_8_replicas": ["backend=sim", "hardware=h100", "model=llama3_70b", "tensor_parallel_size=8", "workload=trace",
                         f"workload.path={TRACE}", "scheduler=slo_aware", "cluster.replicas=8", "workload.time_scale=0.125"],
    "synthetic_10k": ["backend=sim", "hardware=h100", "model=llama3_8b", "workload.num_requests=10000", "workload.rate=20"],
    "synthetic_100k": ["backend=sim", "hardware=h100", "model=llama3_8b", "workload.num_requests=100000", "workload.rate=20"],
}


def run_case(name: str, profile: bool, extra: list[str]) -> dict:
    from servelab.api import compose
    from servelab.engine.engine import Engine
    from servelab.run.session import run_job

    forwarded = [0]
    fast_forward = Engine.fast_forward

    def counted(self, *args, **kwargs):  # the share of steps fast-forwarded, clusters too
        steps = fast_forward(self, *args, **kwargs)
        forwarded[0] += steps
        return steps

    Engine.fast_forward = counted  # type: ignore[method-assign]
    cfg = compose(CASES[name] + extra, logger="none", progress=False)
    start, cpu_start = time.perf_counter(), time.process_time()
    if profile:
        import cProfile
        import pstats

        prof = cProfile.Profile()
        prof.enable()
    result = run_job(cfg, Path("outputs") / "sim_speed" / name)
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu_start
    if profile:
        prof.disable()
        pstats.Stats(prof, stream=sys.stderr).sort_stats("tottime").print_stats(25)
    s = result.summary
    return {"case": name, "wall_s": wall, "cpu_s": cpu, "num_requests": s["num_requests"], "num_steps": s["num_steps"],
            "simulated_s": s["duration_s"], "us_per_step": wall / max(1, s["num_steps"]) * 1e6,
            "ff_share": forwarded[0] / max(1, s["num_steps"]),
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "leaked_blocks": s["leaked_blocks"]}


def startup(name: str) -> dict:
    """Seconds from a fresh interpreter to the first step: imports, composing, the workload, the stack."""
    t0 = time.perf_counter()
    from servelab.api import compose
    from servelab.run.session import run_job  # noqa: F401 - what run.py imports before the run
    from servelab.assemble.executor import model_shape
    from servelab.assemble.stack import build_stack
    from servelab.workloads.build import build_requests
    t1 = time.perf_counter()
    cfg = compose(CASES[name], logger="none", progress=False)
    t2 = time.perf_counter()
    requests = build_requests(cfg.workload, model_shape(cfg).vocab_size, cfg.max_model_len)
    list(requests) if getattr(requests, "in_arrival_order", False) else None
    t3 = time.perf_counter()
    build_stack(cfg, requests=requests)
    t4 = time.perf_counter()
    return {"imports_s": t1 - t0, "compose_s": t2 - t1, "workload_s": t3 - t2, "stack_s": t4 - t3, "total_s": t4 - t0}


def child(name: str, ff: bool) -> dict:
    cmd = [sys.executable, __file__, "--one", name, f"sim.fast_forward={str(ff).lower()}"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def row(r: dict, label: str = "") -> str:
    return (f"| {r['case']}{label} | {r['num_requests']:,} | {r['num_steps']:,} | {r['ff_share']:.0%} "
            f"| {r['simulated_s']:,.0f} s | {r['wall_s']:.1f} s | {r['cpu_s']:.1f} s "
            f"| {r['cpu_s'] / max(1, r['num_steps']) * 1e6:.0f} | {r['peak_rss_mb']:,.0f} MB | {r['leaked_blocks']} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("cases", nargs="*", default=[])
    ap.add_argument("--both", type=int, metavar="PAIRS", default=0,
                    help="run each case PAIRS times with fast-forward on and off, interleaved")
    ap.add_argument("--startup", action="store_true", help="time the start-up of the first case instead")
    ap.add_argument("--profile", metavar="CASE", help="run CASE in this process under cProfile")
    ap.add_argument("--one", metavar="CASE", help=argparse.SUPPRESS)  # a child process
    args, extra = ap.parse_known_args()
    if args.one or args.profile:  # the positional arguments are overrides here (sim.fast_forward=false)
        print(json.dumps(run_case(args.one or args.profile, bool(args.profile), [*args.cases, *extra])))
        return
    args.cases = args.cases or [c for c in CASES if c != "azure_1m"]
    if args.startup:
        name = args.cases[0]
        out = subprocess.run([sys.executable, "-c", f"import json, sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); "
                              f"import sim_speed; print(json.dumps(sim_speed.startup({name!r})))"],
                             capture_output=True, text=True, check=True)
        print(name, out.stdout.strip().splitlines()[-1])
        return
    print("| case | requests | steps | ff | simulated | wall | CPU | us/step (CPU) | peak RSS | leaked |\n"
          "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name in args.cases:
        if not args.both:
            print(row(child(name, True)), flush=True)
            continue
        walls: dict[bool, list[float]] = {True: [], False: []}
        for _ in range(args.both):
            for ff in (False, True):  # interleaved: the machine's load drifts alike for both
                r = child(name, ff)
                walls[ff].append(r["wall_s"])
                print(row(r, " (fast-forward)" if ff else " (step by step)"), flush=True)
        on, off = min(walls[True]), min(walls[False])
        print(f"| {name}: best of {args.both}, step by step {off:.1f} s, fast-forward {on:.1f} s: {off / on:.2f}x |",
              flush=True)


if __name__ == "__main__":
    main()
