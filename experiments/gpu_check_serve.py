"""A real GPU serving run of a Llama-3-8B-shaped random checkpoint beside the simulator's prediction.

    python experiments/gpu_check_serve.py OUT_DIR                      # CUDA: llama3_8b shape, bfloat16
    python experiments/gpu_check_serve.py OUT_DIR --op-tables DIR      # also op_profile from fresh tables
    python experiments/gpu_check_serve.py OUT_DIR --sim-only           # the prediction alone (any machine)
    python experiments/gpu_check_serve.py OUT_DIR --device cpu --preset tiny   # dry run of the script

1. Writes a random checkpoint of the preset's shape (``llama3_8b``: ``conf/model/llama3_8b.yaml``'s,
   built on the device in ``model.dtype`` with transformers' own init and ``save_pretrained``:
   config.json + safetensors, never a hub download) into ``--work`` (a temporary folder by default,
   removed at the end: 16 GB at 8B).
2. Runs the preset's workload on the real engine (``backend=torch``, wall clock) after a short
   warm-up on the same stack (Triton's JIT, cuBLAS set-up), into ``OUT_DIR/real/``.
3. Runs the same workload in the simulator (``backend=sim hardware=h200``): ``time_model=auto`` (what
   ships) into ``OUT_DIR/sim_auto/``, and ``time_model=op_profile`` on the tables under ``--op-tables``
   (``servelab profile-ops``'s folder; the first whose shape and dtype fit) into ``OUT_DIR/sim_op_profile/``.
4. Writes ``OUT_DIR/compare.json`` and ``OUT_DIR/compare.md``: output throughput, TTFT p50/p90, TPOT
   p50/p90 and E2E p50 of each run, and each prediction over the measurement.

Both sides get the same requests (same workload config and seed, same vocabulary; ``compare.json``
says whether their lengths and arrival times matched). The simulator prices the ``hardware`` given
(default h200), so a ratio is a fidelity figure only when the real run was on that GPU; the dry run's
ratios (CPU against H200) test the plumbing, nothing else. Exits 1 if a run did not finish every
request or the two sides' workloads differ.
"""

from __future__ import annotations

import argparse
import gc
import json
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence

REPO = Path(__file__).resolve().parents[1]
SHAPE_KEYS = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
              "vocab_size", "tie_word_embeddings")


@dataclass(frozen=True)
class Preset:
    """A model shape and the workload run on it (Poisson arrivals, uniform lengths, seed 0)."""

    dtype: str
    max_model_len: int
    num_requests: int
    rate: float
    prompt_len: tuple[int, int]
    output_len: tuple[int, int]
    warmup_requests: int
    warmup_output_len: int


# llama3_8b: about 20 s of arrivals; 128 x 144 output tokens on average. tiny: seconds on 2 CPU cores.
PRESETS = {
    "llama3_8b": Preset("bfloat16", 4096, 128, 8.0, (128, 1024), (32, 256), 16, 8),
    "tiny": Preset("float32", 512, 6, 20.0, (16, 64), (4, 12), 2, 2),
}


def preset_shape(name: str) -> dict:
    """The preset's model shape: ``llama3_8b`` from ``conf/model/llama3_8b.yaml``, ``tiny`` from the
    shipped ``tiny_code`` checkpoint's config.json (so ``servelab profile-ops model=tiny_code`` tables fit it)."""
    if name == "tiny":
        config = json.loads((REPO / "framework" / "checkpoints" / "tiny_code" / "config.json").read_text())
        return {k: config[k] for k in SHAPE_KEYS}
    from servelab.api import compose

    model = compose([f"model={name}", "logger=none"]).model
    return {k: model[k] for k in SHAPE_KEYS}


def workload_overrides(p: Preset) -> list[str]:
    return ["workload=synthetic", "seed=0", f"workload.num_requests={p.num_requests}", "workload.arrival=poisson",
            f"workload.rate={p.rate}", "workload.prompt_len.dist=uniform", f"workload.prompt_len.min={p.prompt_len[0]}",
            f"workload.prompt_len.max={p.prompt_len[1]}", "workload.output_len.dist=uniform",
            f"workload.output_len.min={p.output_len[0]}", f"workload.output_len.max={p.output_len[1]}",
            f"max_model_len={p.max_model_len}", "logger=none", "progress=false"]


def warmup_overrides(p: Preset) -> list[str]:
    """A few requests at once over the workload's prompt lengths: compiles the kernels both paths use."""
    return ["workload.arrival=all_at_once", f"workload.num_requests={p.warmup_requests}",
            "workload.output_len.dist=fixed", f"workload.output_len.mean={p.warmup_output_len}",
            f"workload.output_len.min={p.warmup_output_len}", f"workload.output_len.max={p.warmup_output_len}"]


def real_overrides(p: Preset, checkpoint: Path, device: str, hardware: str) -> list[str]:
    return ["model=hf", f"model.path={checkpoint}", f"model.dtype={p.dtype}", f"backend.device={device}",
            f"hardware={hardware}", *workload_overrides(p)]


def sim_overrides(name: str, p: Preset, hardware: str, time_model: list[str]) -> list[str]:
    """The same model shape and workload in the simulator (``model=tiny`` carries any shape)."""
    shape = preset_shape(name)
    return ["backend=sim", "model=tiny", f"model.name={name}", "model.shape_only=true", f"model.dtype={p.dtype}",
            *(f"model.{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in shape.items()),
            f"model.max_position_embeddings={p.max_model_len}", f"hardware={hardware}", *time_model,
            *workload_overrides(p)]


def write_checkpoint(path: Path, shape: dict, dtype: str, device: str, max_positions: int, seed: int = 0) -> Path:
    """A random Llama checkpoint of ``shape`` (transformers' init) built on ``device`` in ``dtype``."""
    import torch
    import transformers

    config = transformers.LlamaConfig(architectures=["LlamaForCausalLM"], max_position_embeddings=max_positions,
                                      **shape)
    torch.manual_seed(seed)
    with torch.device(device):  # at 8B: seconds on the GPU, minutes on a CPU
        model = transformers.LlamaForCausalLM(config).to(getattr(torch, dtype)).eval()
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path, safe_serialization=True)
    del model
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return path


def find_tables(root: Path | None, name: str, p: Preset):
    """``(folder, None)`` for the first op-table folder under ``root`` that prices this shape at TP 1
    in this dtype, else ``(None, why not)``."""
    if root is None:
        return None, "no --op-tables given"
    from servelab.core.shapes import ModelShape
    from servelab.sim.op_tables import load_op_tables

    s = preset_shape(name)
    heads = s["num_attention_heads"]
    shape = ModelShape(s["num_hidden_layers"], s["hidden_size"], s["intermediate_size"], heads,
                       s["num_key_value_heads"], s["hidden_size"] // heads, s["vocab_size"])
    folders = sorted(m.parent for m in root.glob("*/*/manifest.json"))
    problems = []
    for folder in folders:
        try:
            load_op_tables(folder, shape=shape, tp=1, dtype=p.dtype)
        except Exception as exc:  # noqa: BLE001 - a folder for another shape or dtype: say why, try the next
            problems.append(f"{folder.relative_to(root)}: {str(exc).splitlines()[0]}")
            continue
        return folder, None
    return None, (f"no table folder under {root} fits this shape in {p.dtype}"
                  + (f" ({'; '.join(problems)})" if problems else " (none found)"))


METRICS = [  # (label, summary key, percentile or None)
    ("output throughput (tok/s)", "output_throughput_tok_s", None),
    ("TTFT p50 (ms)", "ttft_ms", "p50"),
    ("TTFT p90 (ms)", "ttft_ms", "p90"),
    ("TPOT p50 (ms)", "tpot_ms", "p50"),
    ("TPOT p90 (ms)", "tpot_ms", "p90"),
    ("E2E p50 (ms)", "e2e_ms", "p50"),
]


def figures(summary: dict) -> dict:
    out = {label: (summary.get(key) or {}).get(pct) if pct else summary.get(key) for label, key, pct in METRICS}
    for key in ("duration_s", "num_finished", "num_requests", "num_steps", "num_preemptions", "max_concurrent_requests"):
        out[key] = summary.get(key)
    return out


def workload_fingerprint(run_dir: Path) -> list[tuple]:
    """Each request's prompt length, output length and arrival (microseconds) from ``requests.jsonl``."""
    rows = [json.loads(line) for line in (run_dir / "requests.jsonl").read_text().splitlines() if line.strip()]
    return sorted((r["id"], r["prompt_len"], r["output_len"], round(r["arrival_s"] * 1e6)) for r in rows)


def run(overrides: list[str], out: Path, warmup: list[str] | None = None) -> tuple[dict, float]:
    """``run_job`` on a stack built here (a warm-up on it first when ``warmup``); the summary and seconds."""
    import dataclasses

    from servelab.api import compose
    from servelab.engine.step_totals import StepTotals
    from servelab.run.runner import run_workload
    from servelab.run.session import run_job
    from servelab.assemble.stack import build_stack
    from servelab.workloads.build import build_requests

    cfg = compose(overrides)
    stack = build_stack(cfg)
    try:
        if warmup is not None:  # on the engine itself: no result files; its own request ids
            engine = stack.engine
            warm = build_requests(compose(overrides + warmup).workload, stack.executor.spec.vocab_size,
                                  stack.limits.max_model_len, None)
            engine.keep_steps = False
            run_workload(engine, [dataclasses.replace(r, id=f"warmup-{r.id}") for r in warm])
            engine.totals = StepTotals()  # the run's step counts, maxima and means start at its first step
        start = time.perf_counter()
        summary = run_job(cfg, out, stack=stack).summary
        return summary, time.perf_counter() - start
    finally:
        stack.executor.shutdown()


def ratio(a, b):
    return None if a is None or not b else a / b


def fmt(v) -> str:
    if v is None:
        return "n/a"
    return f"{v:.3g}" if abs(v) < 100 else f"{v:,.0f}"


def markdown(result: dict) -> str:
    real = result["real"]
    sims = {k: v for k, v in result["sims"].items() if "figures" in v}
    head = ["metric"] + (["real"] if real else []) + [f"sim {k}" for k in sims]
    head += [f"sim {k} / real" for k in sims] if real else []
    title = (f"{result['preset']} on {result['device']}: real engine against the simulator" if real else
             f"{result['preset']}: the simulator's prediction")
    lines = [f"# {title} (hardware={result['hardware']})", "",
             f"Workload: {result['workload']}. Same requests on both sides: {result['same_workload']}.", ""]
    if result["device"] != "cuda" or not real:
        lines += ["Not a fidelity figure: " + ("the real run was not on a GPU." if real else "no real run."), ""]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for label, _, _ in METRICS:
        row = [label] + ([fmt(real["figures"][label])] if real else [])
        row += [fmt(s["figures"][label]) for s in sims.values()]
        if real:
            row += [fmt(ratio(s["figures"][label], real["figures"][label])) for s in sims.values()]
        lines.append("| " + " | ".join(row) + " |")
    lines.append("")
    for k, s in result["sims"].items():
        lines.append(f"- sim {k}: " + (s.get("time_model") or f"skipped: {s.get('skipped')}"))
    for k, v in result["seconds"].items():
        lines.append(f"- {k}: {v:.1f} s")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--device", default="cuda", help="where the real engine runs: cuda (default) or cpu")
    ap.add_argument("--preset", default=None, choices=list(PRESETS), help="default: llama3_8b on cuda, tiny on cpu")
    ap.add_argument("--hardware", default="h200", help="the simulator's conf/hardware option (default h200)")
    ap.add_argument("--op-tables", type=Path, default=None, help="servelab profile-ops output (<hw>/<model>/...)")
    ap.add_argument("--work", type=Path, default=None, help="where the checkpoint is written (default: a temp dir)")
    ap.add_argument("--sim-only", action="store_true", help="no checkpoint, no real run: the prediction alone")
    args = ap.parse_args(argv)
    name = args.preset or ("tiny" if args.device == "cpu" else "llama3_8b")
    p = PRESETS[name]
    out = args.out_dir
    out.mkdir(parents=True, exist_ok=True)
    seconds: dict[str, float] = {}
    result: dict = {"preset": name, "device": args.device, "hardware": args.hardware, "model_dtype": p.dtype,
                    "shape": preset_shape(name), "preset_settings": asdict(p),
                    "workload": (f"{p.num_requests} requests, Poisson {p.rate} req/s, prompts uniform "
                                 f"{p.prompt_len[0]}-{p.prompt_len[1]}, outputs uniform "
                                 f"{p.output_len[0]}-{p.output_len[1]} tokens (ignore EOS), seed 0"),
                    "real": None, "sims": {}, "seconds": seconds}
    failures = []

    if not args.sim_only:
        import torch

        if args.device.startswith("cuda") and not torch.cuda.is_available():
            print("gpu_check_serve: no CUDA device visible (use --device cpu for a dry run, or --sim-only)")
            return 1
        work = args.work or Path(tempfile.mkdtemp(prefix="gpu_check_serve-"))
        try:
            start = time.perf_counter()
            ckpt = write_checkpoint(work / f"{name}-random", preset_shape(name), p.dtype, args.device, p.max_model_len)
            seconds["write checkpoint"] = time.perf_counter() - start
            print(f"checkpoint: {ckpt} ({seconds['write checkpoint']:.0f} s)", flush=True)
            start = time.perf_counter()
            summary, seconds["real run"] = run(real_overrides(p, ckpt, args.device, args.hardware), out / "real",
                                               warmup=warmup_overrides(p))
            seconds["real: load, warm-up and run"] = time.perf_counter() - start
            result["real"] = {"figures": figures(summary), "run_dir": "real"}
        finally:
            if args.work is None:
                shutil.rmtree(work, ignore_errors=True)

    tables, why_not = find_tables(args.op_tables, name, p)
    sims = {"auto": ["time_model=auto"]}
    if tables is not None:
        sims["op_profile"] = ["time_model=op_profile", f"time_model.path={tables}"]
    else:
        result["sims"]["op_profile"] = {"skipped": why_not}
    for key, tm in sims.items():
        summary, seconds[f"sim {key}"] = run(sim_overrides(name, p, args.hardware, tm), out / f"sim_{key}")
        desc = summary.get("time_model") or {}
        label = desc.get("chosen", desc.get("name"))
        result["sims"][key] = {"figures": figures(summary), "run_dir": f"sim_{key}",
                               "time_model": f"{label}: {desc.get('why') or (tables if key == 'op_profile' else '')}"}
        print(f"sim {key}: {result['sims'][key]['time_model']}", flush=True)

    runs = [r for r in [result["real"], *result["sims"].values()] if r and "figures" in r]
    for r in runs:
        f = r["figures"]
        if f["num_finished"] != f["num_requests"]:
            failures.append(f"{r['run_dir']}: {f['num_finished']} of {f['num_requests']} requests finished")
    prints = {r["run_dir"]: workload_fingerprint(out / r["run_dir"]) for r in runs}
    result["same_workload"] = len({json.dumps(v) for v in prints.values()}) == 1
    if not result["same_workload"]:
        failures.append("the runs' requests differ (prompt/output lengths or arrivals)")
    if result["real"]:
        result["ratio_sim_over_real"] = {k: {label: ratio(s["figures"][label], result["real"]["figures"][label])
                                             for label, _, _ in METRICS}
                                         for k, s in result["sims"].items() if "figures" in s}
    result["failures"] = failures
    (out / "compare.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / "compare.md").write_text(markdown(result))
    print((out / "compare.md").read_text())
    for failure in failures:
        print(f"FAIL {failure}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
