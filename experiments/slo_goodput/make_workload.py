"""Write bursty.jsonl: a bursty (Gamma, CV 3) request stream with two priority classes.

    python experiments/slo_goodput/make_workload.py

160 requests at a mean 8 req/s with Gamma inter-arrival times of coefficient of variation 3 (so
requests come in bursts, as in AlpaServe/DistServe), prompts 32-256 tokens, outputs 16-128
tokens; a quarter of them (at random) are urgent (``priority`` 0), the rest priority 1. The
sweep compresses time (``workload.time_scale``) to raise the load. SLOs are the run's
``slo.ttft_ms`` / ``slo.tpot_ms`` (no per-request targets), so every scheduler is judged alike.
"""

import json
from pathlib import Path

import numpy as np

RATE, CV, N = 8.0, 3.0, 160


def main() -> None:
    rng = np.random.default_rng(0)
    shape = 1 / CV**2
    gaps = rng.gamma(shape, 1 / (RATE * shape), size=N)
    arrivals = np.concatenate([[0.0], np.cumsum(gaps[:-1])])
    rows = [{"id": f"req-{i}", "prompt_len": int(rng.integers(32, 257)), "max_tokens": int(rng.integers(16, 129)),
             "arrival_time": round(float(t), 4), "priority": int(rng.random() >= 0.25)}
            for i, t in enumerate(arrivals)]
    out = Path(__file__).with_name("bursty.jsonl")
    out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(f"wrote {N} requests over {arrivals[-1]:.1f} s to {out}")


if __name__ == "__main__":
    main()
