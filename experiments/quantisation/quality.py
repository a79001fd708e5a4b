"""What quantisation costs in quality on the shipped trained model (model=tiny_code): held-out bits
per byte and perplexity (servelab eval-ppl), and greedy agreement with the unquantised model on
held-out code prefixes, for INT8 weights, INT8 KV, FP8 KV and both.

    python experiments/quantisation/quality.py                    # writes quality.json beside this script
    python experiments/quantisation/quality.py --max-tokens 0     # the whole held-out split (527k tokens)

Greedy agreement: each prompt generates ``--new-tokens`` tokens (EOS ignored) with and without the
setting; ``prefix_agreement`` is the mean fraction generated before the first differing token,
``token_agreement`` the fraction of positions that agree, ``identical`` the fraction of prompts
whose whole continuation is the same. Deterministic: no clock is involved.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
SETTINGS = {
    "none": [],
    "int8 weights": ["model.quantization=int8"],
    "int8 KV": ["kv_cache_dtype=int8"],
    "fp8 KV": ["kv_cache_dtype=fp8_e4m3"],
    "int8 weights + int8 KV": ["model.quantization=int8", "kv_cache_dtype=int8"],
    "int8 weights + fp8 KV": ["model.quantization=int8", "kv_cache_dtype=fp8_e4m3"],
}


def heldout_prompts(n: int, seed: int, prefix_bytes: int) -> list[list[int]]:
    from servelab.workloads import corpus
    from servelab.core.packaged import PACKAGED_CHECKPOINTS
    from servelab.workloads.text import load_tokenizer

    docs = [d for d in corpus.heldout_documents() if len(d.encode()) > prefix_bytes + 64]
    tok = load_tokenizer(PACKAGED_CHECKPOINTS / "tiny_code")
    rng = random.Random(seed)
    return [tok(d.encode()[:prefix_bytes].decode("utf-8", errors="ignore"))["input_ids"] for d in rng.sample(docs, n)]


def generate(overrides: list[str], prompts: list[list[int]], new_tokens: int) -> list[list[int]]:
    from servelab.api import LLM, compose

    lab = LLM(compose(["model=tiny_code", "max_num_seqs=32", *overrides], logger="none", progress=False))
    try:
        for p in prompts:
            lab.add_request(p, new_tokens, ignore_eos=True)
        while lab.has_unfinished():
            lab.step()
        return [r["output_token_ids"] for r in lab.results().requests]
    finally:
        lab.close()


def agreement(got: list[list[int]], base: list[list[int]]) -> dict:
    prefixes, same, total = [], 0, 0
    for g, b in zip(got, base):
        first = next((i for i, (x, y) in enumerate(zip(g, b)) if x != y), len(b))
        prefixes.append(first / len(b))
        same += sum(x == y for x, y in zip(g, b))
        total += len(b)
    return {"prefix_agreement": sum(prefixes) / len(prefixes), "token_agreement": same / total,
            "identical": sum(p == 1.0 for p in prefixes) / len(prefixes)}


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--max-tokens", type=int, default=100_000, help="held-out tokens scored (0 = all)")
    p.add_argument("--prompts", type=int, default=32)
    p.add_argument("--new-tokens", type=int, default=64)
    p.add_argument("--prefix-bytes", type=int, default=96)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=str(HERE / "quality.json"))
    args = p.parse_args(argv)
    from servelab.api import compose
    from servelab.cli.eval_ppl import evaluate

    prompts = heldout_prompts(args.prompts, args.seed, args.prefix_bytes)
    rows, base = [], None
    for name, overrides in SETTINGS.items():
        t0 = time.perf_counter()
        ppl_over = ["model=tiny_code", *overrides] + ([f"eval_ppl.max_tokens={args.max_tokens}"] if args.max_tokens else [])
        ppl = evaluate(compose(ppl_over, logger="none", progress=False))
        outputs = generate(overrides, prompts, args.new_tokens)
        base = outputs if base is None else base
        row = {"setting": name, "overrides": overrides, "bits_per_byte": ppl["bits_per_byte"],
               "perplexity": ppl["perplexity"], "num_tokens": ppl["num_tokens"], **agreement(outputs, base),
               "wall_s": round(time.perf_counter() - t0, 1)}
        rows.append(row)
        print(f"{name:24s} bpb {row['bits_per_byte']:.4f} ppl {row['perplexity']:.4f} prefix agreement "
              f"{row['prefix_agreement']:.3f} identical {row['identical']:.3f}", flush=True)
    result = {"settings": vars(args), "model": "tiny_code (float32 compute)", "rows": rows,
              "machine": f"{platform.node()}, Python {platform.python_version()}",
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")
    return result


if __name__ == "__main__":
    main(sys.argv[1:])
