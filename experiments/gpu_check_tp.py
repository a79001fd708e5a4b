"""One-command GPU check of tensor parallelism (a few minutes).

    python experiments/gpu_check_tp.py              # CUDA: TP=1 and TP=2 (>= 2 GPUs), same greedy tokens
    python experiments/gpu_check_tp.py --device cpu --preset tiny --num-requests 4 --max-tokens 8
                                                    # dry run of the script itself on CPU (gloo)

For each tensor-parallel size that fits the visible devices it runs the same workload (greedy,
float32 by default so TP's different summation order cannot flip a near-tie) on the same random
checkpoint, checks that every TP>1 run produced exactly TP=1's tokens, and prints throughput and
the per-run model/communication time split. On a 1-GPU machine it runs TP=1 on CUDA and says why
TP=2 was skipped. Exits 1 on any token mismatch or leaked block.

On CUDA the communication time counts only the launch of the NCCL collectives (they are
asynchronous); the step time is exact.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path
from typing import Sequence

import torch

# A Llama-shaped model big enough for sharding to matter on a GPU; tiny for the CPU dry run.
PRESETS = {
    "gpu": dict(hidden_size=2048, intermediate_size=5632, num_hidden_layers=8, num_attention_heads=16,
                num_key_value_heads=8, vocab_size=32000, max_position_embeddings=4096),
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, vocab_size=1001, max_position_embeddings=512),
}


def plan_sizes(requested: Sequence[int], device: str, num_cuda_devices: int) -> tuple[list[int], dict[int, str]]:
    """The sizes to run here, and a reason for each size skipped."""
    run, skipped = [], {}
    for size in requested:
        if device.startswith("cuda") and size > num_cuda_devices:
            skipped[size] = (f"needs {size} CUDA devices (one per rank) but {num_cuda_devices} "
                             f"{'is' if num_cuda_devices == 1 else 'are'} visible")
        else:
            run.append(size)
    return run, skipped


def token_mismatches(reference: dict[str, list[int]], other: dict[str, list[int]]) -> list[str]:
    """Ids of requests whose output tokens differ (or that only one run has)."""
    return sorted(rid for rid in set(reference) | set(other) if reference.get(rid) != other.get(rid))


def run_size(size: int, args: argparse.Namespace, model_path: str, out_dir: Path):
    from servelab.api import compose
    from servelab.run.session import run_job

    cfg = compose(["model=hf", "workload=synthetic", f"model.path={model_path}", f"model.dtype={args.dtype}", f"tensor_parallel_size={size}",
                   f"backend.device={args.device}", "logger=none", "progress=false",
                   f"workload.num_requests={args.num_requests}", "workload.arrival=all_at_once",
                   f"workload.prompt_len.min={args.prompt_len // 2}", f"workload.prompt_len.max={args.prompt_len}",
                   "workload.output_len.dist=fixed", f"workload.output_len.mean={args.max_tokens}",
                   f"workload.output_len.min={args.max_tokens}", f"workload.output_len.max={args.max_tokens}",
                   *args.override])
    start = time.perf_counter()
    result = run_job(cfg, out_dir / f"tp{size}")
    return result, time.perf_counter() - start


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 2], help="tensor-parallel sizes; 1 first")
    parser.add_argument("--preset", default="gpu", choices=list(PRESETS))
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--num-requests", type=int, default=64)
    parser.add_argument("--prompt-len", type=int, default=512)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--out", default=None, help="run folders (default: a temporary directory)")
    parser.add_argument("override", nargs="*", help="extra servelab overrides, e.g. max_num_seqs=32")
    args = parser.parse_args(argv)
    if args.sizes[0] != 1:
        parser.error("--sizes must start with 1 (the reference)")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("no CUDA device visible: nothing to check (use --device cpu for a dry run)")
        return 1

    from servelab.exec.model.random_checkpoint import cached_random_checkpoint

    num_gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    sizes, skipped = plan_sizes(args.sizes, args.device, num_gpus)
    print(f"device={args.device} visible CUDA devices={num_gpus} torch={torch.__version__} "
          f"model preset={args.preset} dtype={args.dtype}")
    model_path = str(cached_random_checkpoint("LlamaForCausalLM", 0, PRESETS[args.preset]))
    out_dir = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="gpu_check_tp-"))
    rows, failures, reference = [], [], None
    for size in sizes:
        result, wall = run_size(size, args, model_path, out_dir)
        s = result.summary
        toks = {r["id"]: r["output_token_ids"] for r in result.requests}
        verdict = "reference"
        if reference is None:
            reference = toks
        else:
            bad = token_mismatches(reference, toks)
            verdict = "tokens identical" if not bad else f"MISMATCH in {len(bad)} requests: {bad[:5]}"
            if bad:
                failures.append(f"TP={size}: {verdict}")
        if s["leaked_blocks"]:
            failures.append(f"TP={size}: {s['leaked_blocks']} leaked blocks")
        rows.append((size, s["output_throughput_tok_s"], s["duration_s"], s["model_time_s"], s["comm_time_s"], wall,
                     verdict))
    print(f"\n{'TP':>3} {'out tok/s':>10} {'run s':>8} {'model s':>8} {'comm s':>8} {'wall s':>8}  check")
    for size, tps, dur, model_s, comm_s, wall, verdict in rows:
        print(f"{size:>3} {tps:>10.1f} {dur:>8.2f} {model_s:>8.2f} {comm_s:>8.2f} {wall:>8.1f}  {verdict}")
    base = rows[0][1]
    for size, tps, *_ in rows[1:]:
        print(f"TP={size} throughput = {tps / base:.2f}x TP=1")
    for size, reason in skipped.items():
        print(f"TP={size} skipped: {reason}")
    print(f"run folders: {out_dir}")
    for failure in failures:
        print(f"FAIL {failure}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
