"""servelab's own host time per engine step, measured on the real engine: the figures an
``engine.host`` block for servelab holds (docs/simulator.md "Engines").

    python benchmarks/host_cost.py                                   # model=tiny on this CPU
    python benchmarks/host_cost.py model=llama3_8b ... --json out.json   # any overrides (on CUDA: the GPU's host)

It runs the real engine (``backend=torch``, the wall clock) once per probe batch size (``--batches``):
that many requests arriving together (their prompts' prefill, then decode steps of that batch), with
``debug.log_steps=true``. Every step of ``steps.jsonl`` has its wall time (``duration_s``) and the
executor's time (``model_s``: moving blocks, the forward pass, sampling, reading the sampled tokens
back); the rest is the host's: scheduling, building the batch (block tables, slot mapping,
positions), applying the sampled tokens, finishing sequences, the step's record. A least-squares line
over the steps (each run's first ``--warmup`` left out) gives

    host_s = per_step + per_seq x sequences + per_token x scheduled tokens

(each coefficient clipped at 0), the median host time per step by batch size, and the ``engine.host``
lines of a preset with those figures. It measures operators (the engine's own step phases), never a
request-level latency: the time-model rule's kind of measurement. ``scripts/gpu_check.sh``'s ``host``
stage runs it on the GPU. On a shared CPU the figures move with the machine's load: each run says so.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
from pathlib import Path

import numpy as np

DEFAULTS = ("model=tiny", "backend=torch", "logger=none", "progress=false", "debug.log_steps=true",
            "backend.num_threads=1", "max_num_seqs=64", "max_num_batched_tokens=4096")


def probe_requests(batch: int, prompt_len: int, output_len: int, vocab: int):
    """``batch`` requests arriving together (one run of the probe)."""
    from servelab.core.request import Request

    rng = np.random.default_rng(batch)
    return [Request(id=f"b{batch}-{j}", prompt_token_ids=tuple(int(x) for x in rng.integers(1, vocab, size=prompt_len)),
                    max_tokens=output_len, arrival_time=0.0, ignore_eos=True) for j in range(batch)]


def fit(steps: list[dict]) -> dict:
    """The least-squares line of host seconds over (1, sequences, tokens), coefficients clipped at 0."""
    host = np.array([s["duration_s"] - s["model_s"] - s.get("comm_s", 0.0) for s in steps])
    x = np.array([[1.0, s["num_seqs"], s["num_tokens"]] for s in steps])
    coef, *_ = np.linalg.lstsq(x, host, rcond=None)
    coef = np.maximum(coef, 0.0)
    pred = x @ coef
    by_batch = {}
    for s, h in zip(steps, host):
        if s["prefill_tokens"] == 0:
            by_batch.setdefault(s["num_seqs"], []).append(h)
    return {"per_step_us": coef[0] * 1e6, "per_seq_us": coef[1] * 1e6, "per_token_us": coef[2] * 1e6,
            "median_abs_residual_us": float(np.median(np.abs(host - pred))) * 1e6, "steps": len(steps),
            "decode_host_us_by_batch": {int(b): float(np.median(v)) * 1e6 for b, v in sorted(by_batch.items())},
            "median_host_share": float(np.median(host / np.maximum(1e-12, np.array([s["duration_s"] for s in steps]))))}


def measure(overrides: list[str], batches: list[int], prompt_len: int, output_len: int, warmup: int) -> dict:
    from servelab.api import compose
    from servelab.assemble.stack import build_stack
    from servelab.run.session import run_job

    cfg = compose([*DEFAULTS, *overrides], logger="none", progress=False)
    steps: list[dict] = []
    where: dict = {}
    for batch in batches:  # one run per batch size: its requests arrive together (no idle waits)
        stack = build_stack(cfg)
        reqs = probe_requests(batch, prompt_len, output_len, stack.executor.spec.vocab_size)
        with tempfile.TemporaryDirectory() as out:
            try:
                run_job(cfg, out, requests=reqs, stack=stack)
                where = stack.executor.describe() if hasattr(stack.executor, "describe") else {}
            finally:
                stack.executor.shutdown()
            run = [json.loads(line) for line in (Path(out) / "steps.jsonl").read_text().splitlines()]
        steps += run[warmup:]  # each run's first steps pay first calls and allocations
    return {"model": cfg.model.name, "device": str(where.get("device", cfg.backend.device)),
            "machine": platform.machine(), "cpu_count": os.cpu_count(), "load_average": list(os.getloadavg()),
            "overrides": [*DEFAULTS, *overrides], "batches": batches, "prompt_len": prompt_len,
            "output_len": output_len, "fit": fit(steps)}


def preset_lines(result: dict) -> str:
    f = result["fit"]
    return (f"engine:\n  host:\n    source: engine\n    per_step_us: {f['per_step_us']:.1f}\n"
            f"    per_seq_us: {f['per_seq_us']:.2f}\n    per_token_us: {f['per_token_us']:.3f}\n"
            f"# measured by benchmarks/host_cost.py on {result['device']} ({result['model']}), "
            f"{f['steps']} steps, median |residual| {f['median_abs_residual_us']:.0f} us")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("overrides", nargs="*", help="config overrides (model=..., backend.device=cuda ...)")
    ap.add_argument("--batches", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32])
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--output-len", type=int, default=16)
    ap.add_argument("--warmup", type=int, default=2, help="steps of each run left out of the fit (first calls)")
    ap.add_argument("--json", type=Path, help="write the result here")
    args = ap.parse_args(argv)
    if min(args.batches) < 1 or args.prompt_len < 1 or args.output_len < 2:
        ap.error("--batches >= 1, --prompt-len >= 1 and --output-len >= 2")
    result = measure(args.overrides, args.batches, args.prompt_len, args.output_len, args.warmup)
    f = result["fit"]
    print(f"host per step on {result['device']}: {f['per_step_us']:.1f} us + {f['per_seq_us']:.2f} us/seq + "
          f"{f['per_token_us']:.3f} us/token ({f['steps']} steps, median |residual| "
          f"{f['median_abs_residual_us']:.0f} us; host {100 * f['median_host_share']:.0f}% of a median step; "
          f"load average {result['load_average'][0]:.1f})")
    print("decode steps, median host us by batch: " +
          ", ".join(f"{b}: {v:.0f}" for b, v in f["decode_host_us_by_batch"].items()))
    print(preset_lines(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
