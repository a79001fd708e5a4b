"""The effect of each engine timing feature (``sim.cuda_graphs``, ``sim.all_reduce``, ``frontend``)
on one fidelity case: Llama-3.1-70B on 4 x H100 at 4 req/s Poisson, ShareGPT first turns, as
``experiments/sim_fidelity_gpu/e2e.py`` builds the published vLLM 0.6.0 run
(``sglangpage_vllm_llama31_70b_4xh100_rps4``), cut to ``--requests`` requests.

    python benchmarks/timing_features.py                 # 600 requests, seed 0: a table of median TTFT/TPOT
    python benchmarks/timing_features.py --requests 200 --json out.json

The published figures (median TTFT 179.15 ms, TPOT 23.58 ms) are printed beside them for scale;
that run used ``--num-scheduler-steps 10``, which none of these features models.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "experiments" / "sim_fidelity_gpu"))

ENTRY = "sglangpage_vllm_llama31_70b_4xh100_rps4"
CASES = {
    "off (defaults)": [],
    "sim.cuda_graphs=true": ["sim.cuda_graphs=true"],
    "sim.all_reduce=auto": ["sim.all_reduce=auto"],
    "sim.all_reduce=custom": ["sim.all_reduce=custom"],
    "frontend=servelab_cpu": ["frontend=servelab_cpu"],
    "frontend=vllm_030_detokenize": ["frontend=vllm_030_detokenize"],
    "graphs + auto all-reduce": ["sim.cuda_graphs=true", "sim.all_reduce=auto"],
}


def run_case(entry: dict, extra: list[str], seed: int, max_requests: int) -> dict:
    import e2e  # experiments/sim_fidelity_gpu/e2e.py: the published case's workload and limits

    from servelab.api import compose
    from servelab.core.request import Request
    from servelab.run.session import run_job

    cfg = compose(e2e.overrides(entry, seed) + extra, logger="none", progress=False)
    reqs = e2e.workload(entry, seed, max_requests)
    rng = np.random.default_rng(seed)
    vocab = cfg.model.vocab_size
    requests = [Request(id=f"r{i}", prompt_token_ids=tuple(rng.integers(1, vocab, size=pl).tolist()),
                        max_tokens=ol, arrival_time=a, ignore_eos=True) for i, (a, pl, ol) in enumerate(reqs)]
    with tempfile.TemporaryDirectory() as out:
        s = run_job(cfg, out, requests=requests).summary
    return {"ttft_p50_ms": s["ttft_ms"]["p50"], "tpot_p50_ms": s["tpot_ms"]["p50"], "e2e_p50_ms": s["e2e_ms"]["p50"],
            **{k: s[k] for k in ("cuda_graph_steps", "cuda_graph_padding_share", "all_reduce_impl") if k in s}}


def main(argv: list[str] | None = None) -> int:
    import e2e

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=600)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    entry = next(e for e in e2e.load_published()["entries"] if e["id"] == ENTRY)
    rows = {name: run_case(entry, extra, args.seed, args.requests) for name, extra in CASES.items()}
    base = rows["off (defaults)"]
    print(f"{ENTRY}, {args.requests} requests, seed {args.seed}; published: median TTFT "
          f"{entry['also_reported']['median_ttft_ms']} ms, TPOT {entry['figures']['median_tpot_ms']} ms")
    print(f"{'case':32s} {'TTFT p50 ms':>12s} {'TPOT p50 ms':>12s} {'E2E p50 ms':>11s}  extra")
    for name, r in rows.items():
        extra = {k: v for k, v in r.items() if k not in ("ttft_p50_ms", "tpot_p50_ms", "e2e_p50_ms")}
        print(f"{name:32s} {r['ttft_p50_ms']:12.2f} {r['tpot_p50_ms']:12.2f} {r['e2e_p50_ms']:11.1f}  "
              f"(TTFT {r['ttft_p50_ms'] / base['ttft_p50_ms'] - 1:+.1%}, TPOT {r['tpot_p50_ms'] / base['tpot_p50_ms'] - 1:+.1%}) "
              f"{extra if extra else ''}")
    if args.json:
        args.json.write_text(json.dumps({"entry": ENTRY, "requests": args.requests, "seed": args.seed, "rows": rows},
                                        indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
