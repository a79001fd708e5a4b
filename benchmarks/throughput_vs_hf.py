"""Useful output tokens/s: servelab's default stack vs HF transformers' static batching.

Both run in this one process, interleaved over a few rounds, on the same tiny Llama checkpoint
(hidden 256, 4 layers, 8 heads / 4 KV heads, vocab 4096, float32) and the same workload (64
requests at t=0, prompts uniform 16-512, outputs uniform 8-256, seeded). HF static batching
takes batches of 16 with left padding, greedy, and each batch runs until its longest member is
done; only each request's own tokens count as useful.

    python benchmarks/throughput_vs_hf.py [--rounds 3] [--hf-continuous] [--profile out.prof]
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import statistics
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np
import torch

from servelab.api import LLM, compose
from servelab.core.request import Request
from servelab.assemble.executor import model_path

SHAPE = dict(hidden_size=256, intermediate_size=688, num_hidden_layers=4, num_attention_heads=8,
             num_key_value_heads=4, vocab_size=4096)


def workload(seed: int = 0, n: int = 64) -> list[Request]:
    rng = np.random.default_rng(seed)
    prompts = rng.integers(16, 513, size=n)
    outputs = rng.integers(8, 257, size=n)
    return [Request(f"r{i}", tuple(int(t) for t in rng.integers(0, SHAPE["vocab_size"], size=int(p))), int(o))
            for i, (p, o) in enumerate(zip(prompts, outputs))]


def servelab_config(extra=()):
    overrides = ["model=tiny", "workload=synthetic", *(f"model.{k}={v}" for k, v in SHAPE.items()),
                 "logger=none", "progress=false", *extra]
    return compose(overrides)


def run_servelab(cfg, requests) -> tuple[float, int]:
    lab = LLM(cfg)
    start = time.perf_counter()
    result = lab.generate(requests)
    elapsed = time.perf_counter() - start
    return elapsed, sum(r["output_len"] for r in result.requests)


def run_hf_static(model, requests, batch_size: int = 16) -> tuple[float, int]:
    start = time.perf_counter()
    useful = 0
    with torch.inference_mode():
        for i in range(0, len(requests), batch_size):
            batch = requests[i:i + batch_size]
            width = max(r.prompt_len for r in batch)
            ids = torch.zeros(len(batch), width, dtype=torch.long)
            mask = torch.zeros_like(ids)
            for row, r in enumerate(batch):  # left padding
                ids[row, width - r.prompt_len:] = torch.tensor(r.prompt_token_ids)
                mask[row, width - r.prompt_len:] = 1
            longest = max(r.max_tokens for r in batch)
            model.generate(ids, attention_mask=mask, max_new_tokens=longest, min_new_tokens=longest,
                           do_sample=False, pad_token_id=0, eos_token_id=None)
            useful += sum(r.max_tokens for r in batch)
    return time.perf_counter() - start, useful


def run_hf_continuous(model, requests) -> tuple[float, int]:
    from transformers import GenerationConfig

    gen = GenerationConfig(max_new_tokens=max(r.max_tokens for r in requests), do_sample=False, eos_token_id=None,
                           pad_token_id=0)
    start = time.perf_counter()
    # generate_batch has no per-request length: give every request the longest and count its own.
    model.generate_batch(inputs=[list(r.prompt_token_ids) for r in requests], generation_config=gen)
    return time.perf_counter() - start, sum(r.max_tokens for r in requests)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--hf-continuous", action="store_true", help="also run HF's generate_batch")
    parser.add_argument("--profile", help="write a cProfile of one servelab run to this file and print the top")
    args = parser.parse_args()

    import transformers

    cfg = servelab_config()
    path = model_path(cfg)
    hf = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    requests = workload()
    print(f"checkpoint {path}; {len(requests)} requests, {sum(r.max_tokens for r in requests)} useful output "
          f"tokens; torch threads {torch.get_num_threads()}")
    rates: dict[str, list[float]] = {"hf_static": [], "servelab": []}
    if args.hf_continuous:
        rates["hf_continuous"] = []
    for round_ in range(args.rounds):
        for name in rates:
            if name == "servelab":
                elapsed, tokens = run_servelab(cfg, requests)
            elif name == "hf_static":
                elapsed, tokens = run_hf_static(hf, requests)
            else:
                elapsed, tokens = run_hf_continuous(hf, requests)
            rates[name].append(tokens / elapsed)
            print(f"round {round_}: {name:14s} {tokens / elapsed:8.1f} useful tok/s ({elapsed:.1f} s)")
    med = {k: statistics.median(v) for k, v in rates.items()}
    print("\nmedian useful output tokens/s: " + ", ".join(f"{k} {v:.1f}" for k, v in med.items()))
    print(f"servelab / hf_static = {med['servelab'] / med['hf_static']:.2f}x")
    if args.profile:
        profiler = cProfile.Profile()
        profiler.runcall(run_servelab, cfg, requests)
        profiler.dump_stats(args.profile)
        pstats.Stats(profiler).sort_stats("tottime").print_stats(15)


if __name__ == "__main__":
    main()
