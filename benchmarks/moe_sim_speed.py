"""The simulator's speed on a MoE model against a dense model of the same active size (CPU seconds).

    python benchmarks/moe_sim_speed.py [--repeats 3] [--requests 2000]

The first ``--requests`` requests of the packaged Azure conversation trace at their own arrival times on
8 x H100: Qwen3-30B-A3B (128 experts, top-8 of 768 wide: 6,144 active MLP width per token) at TP 8, at
EP 8, at EP 8 with data-parallel attention, and the same shape with no experts (``model.num_experts=0``:
its dense MLP is 6,144 wide, the same active parameters). Each run is its own process, the cases
alternate, ``backend.num_threads=1``; the figure is the run's CPU time (``time.process_time``, start-up
excluded) and the steps it simulated, median over repeats.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

COMMON = ["backend=sim", "hardware=h100", "model=qwen3_30b_a3b", "tensor_parallel_size=8", "workload=trace",
          "workload.path=azure_conv", "logger=none", "progress=false", "backend.num_threads=1"]
CASES = {"dense, same active size": ["model.num_experts=0"], "MoE TP 8": [],
         "MoE EP 8": ["expert_parallel_size=8"],
         "MoE EP 8 + DP attention": ["expert_parallel_size=8", "data_parallel_attention=true"]}
CHILD = """
import json, sys, tempfile, time
from servelab.api import compose
from servelab.run.session import run_job
cfg = compose(json.loads(sys.argv[1]))
with tempfile.TemporaryDirectory() as out:
    t = time.process_time()
    s = run_job(cfg, out).summary
    print(json.dumps({"cpu_s": time.process_time() - t, "steps": s.get("num_steps")}))
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--requests", type=int, default=2000)
    args = ap.parse_args()
    runs: dict[str, list[dict]] = {name: [] for name in CASES}
    for _ in range(args.repeats):
        for name, extra in CASES.items():
            overrides = COMMON + [f"workload.num_requests={args.requests}"] + extra
            out = subprocess.run([sys.executable, "-c", CHILD, json.dumps(overrides)], capture_output=True,
                                 text=True, check=True)
            runs[name].append(json.loads(out.stdout.strip().splitlines()[-1]))
    print("| case | CPU s (median) | steps | us per step |\n|---|---|---|---|")
    for name, rows in runs.items():
        cpu = statistics.median(r["cpu_s"] for r in rows)
        steps = rows[0]["steps"]
        print(f"| {name} | {cpu:.2f} | {steps:,} | {cpu / steps * 1e6:.0f} |" if steps else f"| {name} | {cpu:.2f} | ? | ? |")


if __name__ == "__main__":
    main()
