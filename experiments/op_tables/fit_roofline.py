"""Fit the calibrated roofline's coefficients to measured GPU operator tables, and say how well they
predict another GPU's tables (held-out hardware).

    python experiments/op_tables/fit_roofline.py [--train a100_80gb] [--out framework/data/op_tables/calibrated_roofline.json]

Rule (README, docs/simulator.md): every coefficient is fitted here, to operator-level measurements
only (servelab/data/op_tables: per-layer GEMM and token-wise kernel times, NCCL all-reduces, host
time per step). Request-level published figures validate the simulator
(experiments/sim_fidelity_gpu) and never feed this fit.

What is fitted, on the training GPU's tables (every model shape and TP degree it has):
- GEMMs (qkv, o, gate_up, down): floor, peak efficiency, the m and n at which efficiency halves,
  HBM efficiency - by minimising the mean squared log error (torch, L-BFGS on log-parameters);
- token-wise kernels (norms, rope, act, add): one floor and an HBM efficiency per kind, the same way;
- all-reduce: the link efficiency from messages >= 8 MiB (the latency floor is the hardware
  catalogue's ``link_latency_us``, itself the measured small-message all-reduce);
- host: step + per-sequence time by least squares on the host tables.
Then every measured point of every GPU is predicted; the held-out GPU's errors are the calibrated
roofline's honest error on hardware without tables.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np
import torch
import yaml

from servelab.core.shapes import HardwareProfile, ModelShape
from servelab.sim.gpu_ops import (CALIBRATION_FILE, GEMMS, TOKENWISE, TOKENWISE_EFF, Calibration, GpuOps, gemm_dims,
                                   tokenwise_bytes_per_token)
from servelab.sim.op_tables import PACKAGED_OP_TABLES, available_op_tables, load_op_tables

REPO = Path(__file__).resolve().parents[2]
ACT_BYTES = 2.0  # the tables were measured in float16


def hardware(name: str) -> HardwareProfile:
    return HardwareProfile.from_config(yaml.safe_load((REPO / "conf" / "hardware" / f"{name}.yaml").read_text()))


def table_shape(shape: dict) -> ModelShape:
    return ModelShape(num_layers=1, hidden_size=shape["hidden_size"], intermediate_size=shape["intermediate_size"],
                      num_heads=shape["num_heads"], num_kv_heads=shape["num_kv_heads"],
                      head_dim=shape.get("head_dim") or shape["hidden_size"] // shape["num_heads"],
                      vocab_size=shape.get("vocab_size", 32000))


def op_points(hw_name: str | None = None) -> list[dict]:
    """Every measured (hardware, model, tp, op) curve: raw medians against tokens."""
    out = []
    for row in available_op_tables():
        if hw_name and row["hardware"] != hw_name:
            continue
        tables = load_op_tables(row["folder"])
        for tp in tables.tp_degrees:
            for op in GEMMS + TOKENWISE:
                c = tables.op_curve(tp, op)
                out.append({"hardware": row["hardware"], "model": row["model"], "tp": tp, "op": op,
                            "shape": table_shape(row["shape"]), "m": c.x, "y": c.raw_y})
    return out


def predict(ops: GpuOps, p: dict) -> np.ndarray:
    return ops.layer_op(p["op"], p["m"], p["shape"], p["tp"], ACT_BYTES, ACT_BYTES)


# ---- the fit ----------------------------------------------------------------------------------
def _torch_fit(points: list[dict], hw: dict, kind: str, init: dict, steps: int = 200) -> dict:
    """Minimise the mean squared log error of one operator family over ``points`` (L-BFGS)."""
    names = list(init)
    raw = torch.tensor([math.log(init[k]) for k in names], dtype=torch.float64, requires_grad=True)
    data = []
    for p in points:
        h = hw[p["hardware"]]
        m = torch.tensor(p["m"], dtype=torch.float64)
        y = torch.tensor(p["y"], dtype=torch.float64)
        keep = y > 0
        if kind == "gemm":
            k, n = gemm_dims(p["shape"], p["tp"])[p["op"]]
        else:
            k, n = tokenwise_bytes_per_token(p["shape"], p["tp"], ACT_BYTES)[p["op"]], TOKENWISE_EFF[p["op"]]
        data.append((m[keep], y[keep], k, n, h.peak_tflops * 1e12, h.hbm_bandwidth_gb_s * 1e9))

    def coefs():
        v = dict(zip(names, torch.exp(raw)))
        for key in ("gemm_eff_max", "bw_eff", *TOKENWISE_EFF.values()):
            if key in v:
                v[key] = torch.clamp(v[key], max=1.0)
        return v

    def loss_fn():
        v = coefs()
        errs = []
        for m, y, k, n, peak, hbm in data:
            if kind == "gemm":
                eff = v["gemm_eff_max"] * m / (m + v["gemm_m_half"]) * n / (n + v["gemm_n_half"])
                compute = 2 * m * k * n / (peak * eff)
                memory = (k * n * ACT_BYTES + m * (k + n) * ACT_BYTES) / (hbm * v["bw_eff"])
                pred = v["gemm_floor_us"] * 1e-6 + torch.maximum(compute, memory)
            else:
                pred = v["tokenwise_floor_us"] * 1e-6 + m * k / (hbm * v[n])
            errs.append(torch.log(pred / y))
        return torch.cat(errs).pow(2).mean()

    opt = torch.optim.LBFGS([raw], lr=0.5, max_iter=steps, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = loss_fn()
        loss.backward()
        return loss

    opt.step(closure)
    return {k: float(v.detach()) for k, v in coefs().items()}


def fit(train: str) -> Calibration:
    pts = op_points(train)
    hw = {train: hardware(train)}
    gemm = _torch_fit([p for p in pts if p["op"] in GEMMS], hw, "gemm",
                      {"gemm_floor_us": 6.0, "gemm_eff_max": 0.7, "gemm_m_half": 16.0, "gemm_n_half": 256.0,
                       "bw_eff": 0.8})
    tokenwise = _torch_fit([p for p in pts if p["op"] in TOKENWISE], hw, "tokenwise",
                           {"tokenwise_floor_us": 4.0, **{k: 0.6 for k in sorted(set(TOKENWISE_EFF.values()))}})
    link_eff = fit_link_eff(train)
    host_step_us, host_per_seq_us = fit_host(train)
    files = sorted({r["folder"] for r in available_op_tables() if r["hardware"] == train})
    source = {"fitted_on": train, "fitter": "experiments/op_tables/fit_roofline.py",
              "tables": [str(Path(f).relative_to(PACKAGED_OP_TABLES)) for f in files],
              "rule": "fitted to operator-level measurements only; request-level figures never tune it"}
    return Calibration(**{k: round(v, 4) for k, v in {**gemm, **tokenwise}.items()}, link_eff=round(link_eff, 4),
                       host_step_us=round(host_step_us, 1), host_per_seq_us=round(host_per_seq_us, 2), source=source)


def allreduce_points(hw_name: str) -> list[tuple[int, np.ndarray, np.ndarray]]:
    row = next(r for r in available_op_tables() if r["hardware"] == hw_name)
    tables = load_op_tables(row["folder"])
    out = []
    for tp in (2, 4, 8):
        c = tables.allreduce_curve(tp)
        if c is not None:
            out.append((tp, c.x, c.raw_y))
    return out


def fit_link_eff(hw_name: str) -> float:
    """Bus bandwidth achieved / spec over large messages (>= 8 MiB), the median over TP degrees."""
    h = hardware(hw_name)
    effs = []
    for tp, x, y in allreduce_points(hw_name):
        big = x >= 8 * 2**20
        lat = h.link_latency_us * 1e-6
        effs += list(2 * (tp - 1) / tp * x[big] / np.maximum(y[big] - lat, 1e-9) / (h.link_bandwidth_gb_s * 1e9))
    return float(np.median(effs))


def fit_host(hw_name: str) -> tuple[float, float]:
    xs, ys = [], []
    for row in available_op_tables():
        if row["hardware"] == hw_name and row["host"]:
            c = load_op_tables(row["folder"]).host_curve()
            xs += list(c.x)
            ys += list(c.raw_y)
    if not xs:
        return Calibration.host_step_us, Calibration.host_per_seq_us
    a = np.stack([np.ones(len(xs)), np.array(xs)], axis=1)
    (c0, c1), *_ = np.linalg.lstsq(a, np.array(ys) * 1e6, rcond=None)
    return float(max(c0, 0.0)), float(max(c1, 0.0))


# ---- errors -------------------------------------------------------------------------------------
def errors(ops_by_hw: dict[str, GpuOps], points: list[dict]) -> dict:
    """|predicted / measured - 1| per (hardware, model, tp, family), median and p90."""
    out: dict = {}
    for p in points:
        pred = predict(ops_by_hw[p["hardware"]], p)
        rel = np.abs(pred / p["y"] - 1)
        family = "gemm" if p["op"] in GEMMS else "tokenwise"
        out.setdefault((p["hardware"], p["model"], p["tp"], family), []).append(rel)
    return {k: np.concatenate(v) for k, v in out.items()}


def summarise(errs: dict) -> dict:
    rows = {}
    for hw in sorted({k[0] for k in errs}):
        allv = np.concatenate([v for k, v in errs.items() if k[0] == hw])
        rows[hw] = {"median": round(float(np.median(allv)), 4), "p90": round(float(np.quantile(allv, 0.9)), 4),
                    "points": int(allv.size)}
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--train", default="a100_80gb", help="the GPU whose tables fit the coefficients")
    ap.add_argument("--out", type=Path, default=CALIBRATION_FILE)
    args = ap.parse_args(argv)
    cal = fit(args.train)
    hws = sorted({r["hardware"] for r in available_op_tables()})
    errs = errors({h: GpuOps(hardware(h), cal) for h in hws}, op_points())
    summary = summarise(errs)
    data = {"format": "servelab-calibrated-roofline/1", "coefficients": cal.coefficients(),
            "source": {**cal.source, "error_per_operator": summary,
                       "held_out": [h for h in hws if h != args.train]}}
    args.out.write_text(json.dumps(data, indent=1) + "\n")
    print(json.dumps(data, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
