"""Convert Microsoft Vidur's public GPU profiles into servelab op tables (format servelab-op-tables/1).

    python experiments/op_tables/convert_vidur.py /path/to/vidur/.git [--commit HEAD] [--out DIR]

Reads the files straight from a local git directory of https://github.com/microsoft/vidur (MIT):

- data/profiling/compute/{a100,h100}/meta-llama/<model>/mlp.csv: per-operator times of one decoder
  layer on one rank, in ms, by tokens and TP degree -> <hw>/<model>/ops.csv
- data/profiling/network/{a100,h100}_dgx/all_reduce.csv: one NCCL all-reduce, ms, by bytes and
  workers -> <hw>/network/all_reduce.csv (one node, as tensor parallelism runs)
- data/profiling/a100/cpu_overheads.csv at the commit given by --host-commit (later commits dropped
  it): host time per step by batch size -> a100_80gb/<model>/host.csv

Each table keeps the median only, in microseconds, rounded to 4 significant digits; points measured
twice are averaged, and each (tp, column) is made non-decreasing by isotonic regression (the
manifest records how many points that moved and by how much). The format: docs/op-tables.md.
Writes DIR (default framework/data/op_tables): manifests, CSVs and LICENSE-vidur.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import subprocess
from collections import defaultdict
from pathlib import Path

import numpy as np
import yaml

from servelab.sim.op_tables import FORMAT, isotonic

REPO = Path(__file__).resolve().parents[2]
SOURCE_REPO = "https://github.com/microsoft/vidur"
HOST_COMMIT = "6d98aa8f71696520acc603d87439e77cc78160a7"  # "Prepare for open-source release (#6)", 2024-05-08
GPUS = {"a100": "a100_80gb", "h100": "h100"}  # Vidur's a100 is the 80 GB part (its device SKU config)
MODELS = {"meta-llama/Llama-2-7b-hf": "llama2_7b", "meta-llama/Llama-2-70b-hf": "llama2_70b",
          "meta-llama/Meta-Llama-3-8B": "llama3_8b", "meta-llama/Meta-Llama-3-70B": "llama3_70b"}
NETWORKS = {"a100_dgx": ("a100_80gb", "A100 DGX: 8x A100 80GB SXM, NVLink 3 + NVSwitch"),
            "h100_dgx": ("h100", "H100 DGX: 8x H100 80GB SXM5, NVLink 4 + NVSwitch")}
# Vidur's operator names -> servelab's (docs/op-tables.md#operators)
OPS = {"emb": "emb", "input_layernorm": "input_norm", "attn_pre_proj": "qkv", "attn_rope": "rope",
       "attn_post_proj": "o", "post_attention_layernorm": "post_norm", "mlp_up_proj": "gate_up",
       "mlp_act": "act", "mlp_down_proj": "down", "add": "add"}
HOST = {"schedule_median": "schedule", "prepare_inputs_e2e_median": "prepare_inputs",
        "sampler_e2e_median": "sampler", "process_model_outputs_median": "process_outputs",
        "ray_comm_time_mean": "ray_comm"}
HOST_SUM = ["schedule", "prepare_inputs", "sampler", "process_outputs"]
DTYPE_NOTE = ("Vidur profiles in float16 (its ModelConfig.dtype and collectives buffers); bfloat16 runs the same "
              "tensor-core GEMMs at the same rate on A100/H100, so the tables also serve bfloat16.")


def git(git_dir: str, *args: str) -> str:
    return subprocess.run(["git", f"--git-dir={git_dir}", *args], check=True, capture_output=True,
                          text=True).stdout


def rows_at(git_dir: str, commit: str, path: str) -> list[dict]:
    return list(csv.DictReader(io.StringIO(git(git_dir, "show", f"{commit}:{path}"))))


def fmt(v: float) -> str:
    """4 significant digits, no exponent."""
    return f"{float(f'{v:.4g}'):.6f}".rstrip("0").rstrip(".") if v else "0"


def convert_series(rows: list[dict], x_key: str, cols: dict[str, str], stats: dict) -> tuple[list, dict]:
    """Median times (ms) of rows -> (x, {servelab column: us}), duplicates averaged, isotonic."""
    by_x = defaultdict(list)
    for r in rows:
        by_x[float(r[x_key])].append(r)
    stats["duplicates_averaged"] += sum(len(v) - 1 for v in by_x.values())
    xs = sorted(by_x)
    out = {}
    for src, dst in cols.items():
        raw = np.array([np.mean([float(r[src]) for r in by_x[x]]) for x in xs]) * 1e3
        mono = isotonic(raw)
        moved = np.abs(mono - raw) > 0.005 * np.maximum(raw, 1e-9)
        stats["isotonic_points_changed"] += int(moved.sum())
        stats["isotonic_points"] += len(raw)
        if moved.any():
            stats["isotonic_max_change"] = max(stats["isotonic_max_change"],
                                               float(np.max(np.abs(mono - raw)[moved] / raw[moved])))
        out[dst] = mono
    return xs, out


def new_stats() -> dict:
    return {"duplicates_averaged": 0, "isotonic_points_changed": 0, "isotonic_points": 0, "isotonic_max_change": 0.0}


def stats_json(stats: dict) -> dict:
    return {"statistic": "median of the source's repeats", "duplicates_averaged": stats["duplicates_averaged"],
            "monotone": "isotonic regression per (tp, column) (servelab.sim.op_tables.isotonic)",
            "isotonic_points_changed": f"{stats['isotonic_points_changed']} of {stats['isotonic_points']} (by > 0.5%)",
            "isotonic_max_change": f"{stats['isotonic_max_change']:.1%}", "rounding": "4 significant digits"}


def write_csv(path: Path, header: list[str], tps: dict[int, tuple[list, dict]], x_int: bool = True) -> None:
    lines = [",".join(header)]
    for tp in sorted(tps):
        xs, cols = tps[tp]
        for i, x in enumerate(xs):
            lines.append(",".join([str(tp), str(int(x)) if x_int else fmt(x)] + [fmt(cols[c][i]) for c in header[2:]]))
    path.write_text("\n".join(lines) + "\n")


def source(commit: str, path: str, **extra) -> dict:
    return {"repo": SOURCE_REPO, "commit": commit, "path": path, "licence": "MIT",
            "licence_file": "LICENSE-vidur (in servelab/data/op_tables)", **extra,
            "converter": "experiments/op_tables/convert_vidur.py"}


def check_shape(name: str, shape: dict) -> None:
    """The measured shape must be the catalogue model's (conf/model/<name>.yaml), vocabulary aside."""
    m = yaml.safe_load((REPO / "conf" / "model" / f"{name}.yaml").read_text())["model"]
    want = {"hidden_size": m["hidden_size"], "intermediate_size": m["intermediate_size"],
            "num_heads": m["num_attention_heads"], "num_kv_heads": m["num_key_value_heads"]}
    bad = {k: (shape[k], v) for k, v in want.items() if shape[k] != v}
    if bad:
        raise SystemExit(f"{name}: measured shape differs from conf/model/{name}.yaml: {bad}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("git_dir", help="a local git directory of microsoft/vidur (e.g. vidur/.git)")
    ap.add_argument("--commit", default="HEAD")
    ap.add_argument("--host-commit", default=HOST_COMMIT, help="the commit that still has cpu_overheads.csv")
    ap.add_argument("--out", type=Path, default=REPO / "framework" / "data" / "op_tables")
    args = ap.parse_args()
    commit = git(args.git_dir, "rev-parse", args.commit).strip()
    files = git(args.git_dir, "ls-tree", "-r", "--name-only", commit, "data/profiling").split()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "LICENSE-vidur").write_text(git(args.git_dir, "show", f"{commit}:LICENSE"))

    host_rows: dict[str, list[dict]] = {}
    try:
        host_commit = git(args.git_dir, "rev-parse", args.host_commit).strip()
        for r in rows_at(args.git_dir, host_commit, "data/profiling/a100/cpu_overheads.csv"):
            host_rows.setdefault(r["model_name"], []).append(r)
    except subprocess.CalledProcessError:
        host_commit = None
        print(f"no host table: {args.host_commit}:data/profiling/a100/cpu_overheads.csv is not in {args.git_dir}")

    for gpu, hw in GPUS.items():
        for src_model, name in MODELS.items():
            path = f"data/profiling/compute/{gpu}/{src_model}/mlp.csv"
            if path not in files:
                print(f"skip {hw}/{name}: no {path}")
                continue
            rows = rows_at(args.git_dir, commit, path)
            r0 = rows[0]
            shape = {"hidden_size": int(r0["n_embd"]), "intermediate_size": int(r0["n_expanded_embd"]),
                     "num_heads": int(r0["n_head"]), "num_kv_heads": int(r0["n_kv_head"]),
                     "head_dim": int(r0["n_embd"]) // int(r0["n_head"]), "vocab_size": int(r0["vocab_size"])}
            assert all(r["use_gated_mlp"] == "True" for r in rows)
            check_shape(name, shape)
            stats = new_stats()
            by_tp = defaultdict(list)
            for r in rows:
                by_tp[int(r["num_tensor_parallel_workers"])].append(r)
            cols = {f"time_stats.{k}.median": v for k, v in OPS.items()}
            tps = {tp: convert_series(rs, "num_tokens", cols, stats) for tp, rs in by_tp.items()}
            folder = args.out / hw / name
            folder.mkdir(parents=True, exist_ok=True)
            write_csv(folder / "ops.csv", ["tp", "tokens", *OPS.values()], tps)
            tables = {"ops": {"file": "ops.csv", "x": "tokens", "columns": list(OPS.values()), "repeats": 20,
                              "conversion": stats_json(stats)}}
            if host_commit and gpu == "a100" and src_model in host_rows:
                hstats = new_stats()
                hby = defaultdict(list)
                for r in host_rows[src_model]:
                    hby[int(r["tensor_parallel_degree"])].append(r)
                htps = {tp: convert_series(rs, "batch_size", HOST, hstats) for tp, rs in hby.items()}
                write_csv(folder / "host.csv", ["tp", "batch_size", *HOST.values()], htps)
                tables["host"] = {
                    "file": "host.csv", "x": "batch_size", "columns": list(HOST.values()), "sum": HOST_SUM,
                    "repeats": None, "conversion": stats_json(hstats),
                    "source": source(host_commit, "data/profiling/a100/cpu_overheads.csv", measured_model=src_model),
                    "notes": ["Host time of one engine step of the vLLM-derived engine Vidur profiled (Ray workers), "
                              "by batch size (sequences): schedule, prepare_inputs (e2e), sampler (e2e), "
                              "process_outputs are medians; ray_comm (driver-to-worker Ray messaging) is the "
                              "source's mean, Ray-specific, and not in 'sum'.",
                              "The source measured these for one TP degree per model; later Vidur commits "
                              "dropped the file (its simulator skips CPU overheads by default)."]}
            manifest = {
                "format": FORMAT, "kind": "compute", "hardware": hw, "model": name, "shape": shape,
                "dtype": "float16", "serves_dtypes": ["float16", "bfloat16"], "tp_degrees": sorted(tps),
                "time_unit": "us", "tables": tables, "network": "../network",
                "source": source(commit, path, measured_model=src_model, measured_gpu=gpu),
                "notes": [
                    "ops.csv: median GPU time of each operator of ONE decoder layer on ONE rank (column-/row-parallel "
                    "shards at that TP degree), by the number of tokens in the step, measured by Vidur's profiler on "
                    "sarathi-serve's layers (CUDA; its default method, record_function, times 20 repeats per point).",
                    "Not measured: the attention kernels (prefill/decode attention, KV-cache write), the LM head, "
                    "the final norm, sampling, and the all-reduces (see ../network).",
                    "'add' is the one residual add Vidur times per layer (its predictor counts it once).",
                    "shape.vocab_size is the vocabulary Vidur profiled (it pads Llama-2's 32000 to 32768); only "
                    "'emb' depends on it, and matching ignores it.",
                    DTYPE_NOTE],
            }
            (folder / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
            print(f"{hw}/{name}: tp {sorted(tps)}, {len(tps[min(tps)][0])} token counts"
                  + (", host" if "host" in tables else ""))

    for net, (hw, system) in NETWORKS.items():
        path = f"data/profiling/network/{net}/all_reduce.csv"
        if path not in files:
            print(f"skip {hw}/network: no {path}")
            continue
        rows = [r for r in rows_at(args.git_dir, commit, path)
                if r["collective"] == "all_reduce" and r["devices_per_node"] == r["num_workers"]]
        stats = new_stats()
        by_tp = defaultdict(list)
        for r in rows:
            by_tp[int(r["num_workers"])].append(r)
        tps = {tp: convert_series(rs, "size", {"time_stats.all_reduce.median": "all_reduce"}, stats)
               for tp, rs in by_tp.items()}
        folder = args.out / hw / "network"
        folder.mkdir(parents=True, exist_ok=True)
        write_csv(folder / "all_reduce.csv", ["tp", "bytes", "all_reduce"], tps)
        manifest = {
            "format": FORMAT, "kind": "network", "hardware": hw, "dtype": "float16", "tp_degrees": sorted(tps),
            "time_unit": "us",
            "tables": {"all_reduce": {"file": "all_reduce.csv", "x": "bytes", "columns": ["all_reduce"],
                                      "repeats": 3, "conversion": stats_json(stats)}},
            "source": source(commit, path, system=system),
            "notes": [f"One NCCL all-reduce (torch.distributed, float16 buffer) across tp GPUs of one node ({system}), "
                      "by the bytes each rank holds; median of 3 runs, each the median of 11 back-to-back calls "
                      "(kernel time from the profiler: no host launch cost).",
                      "Rows with workers spread over nodes are left out: tensor parallelism stays in one node.",
                      DTYPE_NOTE]}
        old = folder / "manifest.json"
        if old.is_file():  # tables from other sources (custom_all_reduce: docs/op-tables.md) stay
            kept = {k: v for k, v in json.loads(old.read_text())["tables"].items() if k != "all_reduce"}
            manifest["tables"].update(kept)
        (folder / "manifest.json").write_text(json.dumps(manifest, indent=1) + "\n")
        print(f"{hw}/network: all_reduce tp {sorted(tps)}, {len(tps[min(tps)][0])} sizes")


if __name__ == "__main__":
    main()
