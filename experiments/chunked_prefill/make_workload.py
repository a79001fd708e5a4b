"""Write workload.jsonl: short chat requests that decode for a while, interrupted by long prompts.

    python experiments/chunked_prefill/make_workload.py

32 chat requests (prompts 32-64 tokens, 96-128 output tokens, Poisson at 6 req/s) and 8 long
documents (prompts 1,024-1,536 tokens, 8-16 output tokens, one every 0.6 s from 0.5 s). Seeded,
so the file is reproducible; the prompt tokens come from the run's seed (``prompt_len`` entries).
"""

import json
from pathlib import Path

import numpy as np


def main() -> None:
    rng = np.random.default_rng(0)
    rows = []
    t = 0.0
    for i in range(32):
        rows.append({"id": f"chat-{i}", "prompt_len": int(rng.integers(32, 65)), "max_tokens": int(rng.integers(96, 129)),
                     "arrival_time": round(t, 4)})
        t += rng.exponential(1 / 6)
    for i in range(8):
        rows.append({"id": f"doc-{i}", "prompt_len": int(rng.integers(1024, 1537)), "max_tokens": int(rng.integers(8, 17)),
                     "arrival_time": round(0.5 + 0.6 * i, 4)})
    rows.sort(key=lambda r: r["arrival_time"])
    out = Path(__file__).with_name("workload.jsonl")
    out.write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(f"wrote {len(rows)} requests to {out}")


if __name__ == "__main__":
    main()
