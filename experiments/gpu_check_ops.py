"""One-command GPU check of ``servelab profile-ops``: a Llama-3-8B shape's operator tables (< 3 minutes).

    python experiments/gpu_check_ops.py OUT_DIR               # CUDA: model=llama3_8b, bfloat16, TP 1
    python experiments/gpu_check_ops.py OUT_DIR --device cpu  # dry run of the script itself (tiny_code)

Profiles one decoder layer of the ``model=llama3_8b`` shape (random weights, bfloat16, TP 1) at
1..16384 tokens with servelab's own modules, and the torch and Triton paged-attention kernels for
prefill and decode, through the function behind ``servelab profile-ops``; writes
``OUT_DIR/<hardware>/llama3_8b/`` (``hardware`` = this GPU's ``conf/hardware`` name, e.g. ``h200``, or
``--hardware``) and prints a summary: each operator at a few token counts, the layer against the
shipped tables of the same shape (Vidur's A100 / H100, where they exist), and Triton against the
torch reference for attention. Without a CUDA device it prints one line and exits 0.

To ship the result: copy ``OUT_DIR/<hardware>/llama3_8b`` into ``framework/data/op_tables/<hardware>/``
and add a row to docs/op-tables.md and framework/data/op_tables/README.md.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Sequence

import torch


def overrides_for(args: argparse.Namespace) -> list[str]:
    """The ``servelab profile-ops`` arguments of this check."""
    if args.device == "cpu":  # the dry run: the shipped tiny model, a small grid
        out = ["model=tiny_code", "backend.device=cpu", "profile_ops.max_tokens=16", "profile_ops.repeats=2",
               "profile_ops.warmup=1", "profile_ops.attention_backends=[torch]", "profile_ops.prefill_tokens=[4]",
               "profile_ops.contexts=[16,64]", "profile_ops.decode_batches=[1,4]"]
    else:
        out = [f"model={args.model}", "model.dtype=bfloat16", f"backend.device={args.device}",
               f"profile_ops.max_tokens={args.max_tokens}", f"profile_ops.repeats={args.repeats}",
               "profile_ops.attention_backends=[torch,triton]"]
    out += ["tensor_parallel_size=1", "profile_ops.tp_degrees=[1]"]
    if args.hardware:
        out.append(f"profile_ops.hardware={args.hardware}")
    return out


def format_ops(tables, tokens: Sequence[int]) -> str:
    """Each operator's time (us) at a few token counts, and the layer sum."""
    shown = [n for n in tokens if tables.op_curve(1, "qkv").x_range[0] <= n <= tables.op_curve(1, "qkv").x_range[1]]
    lines = [f"{'op':<11}" + "".join(f"{n:>11}" for n in shown)]
    for op in tables.ops:
        curve = tables.op_curve(1, op)
        lines.append(f"{op:<11}" + "".join(f"{curve(n) * 1e6:>11.1f}" for n in shown))
    layer = tables.layer_curve(1)
    lines.append(f"{'layer':<11}" + "".join(f"{layer(n) * 1e6:>11.1f}" for n in shown))
    return "\n".join(lines)


def compare_shipped(tables, tokens: Sequence[int]) -> list[str]:
    """The measured layer against the shipped tables of the same shape (other GPUs), as ratios."""
    from servelab.core.shapes import ModelShape
    from servelab.sim.op_tables import available_op_tables, load_op_tables

    s = tables.shape
    shape = ModelShape(1, s["hidden_size"], s["intermediate_size"], s["num_heads"], s["num_kv_heads"],
                       s["head_dim"], s["vocab_size"])
    out = []
    for row in available_op_tables():
        try:
            other = load_op_tables(row["folder"], shape=shape, tp=1)
        except Exception:  # noqa: BLE001 - another shape or TP: not comparable
            continue
        ours, theirs = tables.layer_curve(1), other.layer_curve(1)
        ratios = ", ".join(f"{n}: {ours(n) / theirs(n):.2f}x" for n in tokens
                           if n <= min(ours.x_range[1], theirs.x_range[1]))
        out.append(f"layer time here / {row['hardware']}/{row['model']} (Vidur) at tokens {ratios}")
    return out or ["no shipped tables of this shape to compare with"]


def attention_summary(rows: list[dict]) -> list[str]:
    """Triton against the torch reference at each point both measured."""
    by = {(r["phase"], r["batch_size"], r["query_len"], r["context_len"], r["backend"]): r for r in rows}
    out = []
    for (phase, b, q, c, backend), r in sorted(by.items()):
        if backend != "torch":
            continue
        line = f"{phase:<8} batch {b:>4} query {q:>5} context {c:>6}: torch {r['attention'] * 1e6:>10.1f} us"
        tri = by.get((phase, b, q, c, "triton"))
        if tri is not None:
            line += f", triton {tri['attention'] * 1e6:>10.1f} us ({r['attention'] / tri['attention']:.1f}x)"
        out.append(line)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir", type=Path, help="where the tables go (OUT_DIR/<hardware>/<model>/)")
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu (a dry run on tiny_code)")
    parser.add_argument("--model", default="llama3_8b", help="a conf/model shape (default llama3_8b)")
    parser.add_argument("--hardware", default=None, help="the tables' hardware name (default: this GPU's)")
    parser.add_argument("--max-tokens", type=int, default=16384)
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args(argv)

    if args.device != "cpu" and not torch.cuda.is_available():
        print("gpu_check_ops: no CUDA device here: skipped (run it on a GPU machine, or --device cpu for a dry run)")
        return 0
    from servelab.cli.profile_ops import profile_ops

    start = time.perf_counter()
    result = profile_ops(overrides_for(args), out=args.out_dir)
    elapsed = time.perf_counter() - start
    tables = result["tables"]
    device = tables.manifest["source"]["device"]
    print(f"{tables.model} ({tables.dtype}) on {device}: tables in {result['folder']} ({elapsed:.0f} s)")
    tokens = [1, 16, 256, 1024, 4096, 16384]
    print(format_ops(tables, tokens))
    for line in compare_shipped(tables, tokens):
        print(line)
    for line in attention_summary(result["attention_rows"]):
        print(line)
    problems = [op for op in tables.ops if not tables.op_curve(1, op).raw_y.min() > 0]
    layer = tables.layer_curve(1)
    if layer(layer.x_range[1]) <= layer(layer.x_range[0]):
        problems.append("the layer is not slower at the most tokens than at the fewest")
    if problems:
        print(f"CHECK FAILED: {', '.join(problems)}")
        return 1
    print(f"all checks passed; results: {result['folder']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
