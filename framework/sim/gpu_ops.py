"""The calibrated roofline's operator formulas: the time of one GEMM, one token-wise kernel, one
attention call and one all-reduce on one rank, from FLOPs and bytes against a spec sheet plus the
terms measured GPU operators show the plain roofline lacks (``time_model=calibrated_roofline``).

- GEMM ``[m x k] @ [k x n]`` (per rank): ``floor + max(flops / (peak x eff(m, n)), bytes / (hbm x bw_eff))``
  with ``eff(m, n) = eff_max x m / (m + m_half) x n / (n + n_half)``: a kernel-launch and minimum-tile
  floor, and an efficiency that falls for few tokens and for narrow per-rank shards.
- token-wise kernel (norm, rotary, activation, residual add): ``floor + bytes / (hbm x eff_kind)``,
  one HBM efficiency per kind of kernel.
- attention (one layer): ``floor + max(flops / (peak x eff_max), bytes / (hbm x bw_eff))``; no public
  table measures it, so it borrows the GEMM fit's floor, peak efficiency and bandwidth efficiency.
- all-reduce of ``b`` bytes over ``tp`` ranks: ``latency + 2 (tp - 1) / tp x b / (link x link_eff)``.
- host side of a step: ``step + per_seq x sequences``.

:class:`Calibration` holds the coefficients; ``experiments/op_tables/fit_roofline.py`` fits them to
the measured operator tables of one GPU (``servelab/data/op_tables``) and writes
``calibrated_roofline.json`` beside the tables. Everything here is numpy-vectorised over tokens.
"""

from __future__ import annotations

import functools
import json
import operator
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import numpy as np

from servelab.core.errors import ConfigError
from servelab.core.shapes import HardwareProfile, ModelShape

CALIBRATION_FILE = Path(__file__).resolve().parents[1] / "data" / "op_tables" / "calibrated_roofline.json"

GEMMS = ("qkv", "o", "gate_up", "down")
TOKENWISE = ("input_norm", "rope", "post_norm", "act", "add")
TOKENWISE_EFF = {"input_norm": "norm_bw_eff", "post_norm": "norm_bw_eff", "rope": "rope_bw_eff",
                 "act": "act_bw_eff", "add": "add_bw_eff"}


@dataclass(frozen=True)
class Calibration:
    """The calibrated roofline's coefficients (times in microseconds, efficiencies as fractions)."""

    gemm_floor_us: float = 6.0
    gemm_eff_max: float = 0.75
    gemm_m_half: float = 16.0
    gemm_n_half: float = 256.0
    bw_eff: float = 0.8
    tokenwise_floor_us: float = 4.0
    norm_bw_eff: float = 0.5  # HBM efficiency per token-wise kernel kind (norms, rope, act, add)
    rope_bw_eff: float = 0.5
    act_bw_eff: float = 0.5
    add_bw_eff: float = 0.8
    host_step_us: float = 1500.0
    host_per_seq_us: float = 20.0
    link_eff: float = 0.7
    source: dict = field(default_factory=dict, compare=False)

    def coefficients(self) -> dict:
        return {k: v for k, v in asdict(self).items() if k != "source"}

    @classmethod
    def load(cls, path: str | Path = CALIBRATION_FILE) -> "Calibration":
        """From a ``calibrated_roofline.json`` (its ``coefficients`` and ``source``)."""
        path = Path(path)
        try:
            data = json.loads(path.read_text())
            coefs = data["coefficients"]
        except (OSError, ValueError, KeyError) as exc:
            raise ConfigError(f"{path}: not a calibrated-roofline file ({exc})") from None
        names = {f.name for f in fields(cls)} - {"source"}
        unknown = set(coefs) - names
        if unknown:
            raise ConfigError(f"{path}: unknown coefficient(s) {sorted(unknown)}; known: {sorted(names)}")
        for key, value in coefs.items():
            if not (isinstance(value, (int, float)) and value >= 0):
                raise ConfigError(f"{path}: coefficient {key}={value!r} must be a number >= 0")
        return cls(**coefs, source=data.get("source", {}))


def gemm_dims(shape: ModelShape, tp: int) -> dict[str, tuple[float, float]]:
    """``(k, n)`` per rank of each decoder-layer GEMM (column-parallel qkv and gate_up, row-parallel o and down)."""
    h, inter = shape.hidden_size, shape.intermediate_size
    return {"qkv": (h, (shape.q_dim + 2 * shape.kv_dim) / tp), "o": (shape.q_dim / tp, h),
            "gate_up": (h, 2 * inter / tp), "down": (inter / tp, h)}


def tokenwise_bytes_per_token(shape: ModelShape, tp: int, act_bytes: float) -> dict[str, float]:
    """Bytes each token-wise kernel reads and writes per token on one rank."""
    h, inter = shape.hidden_size, shape.intermediate_size
    return {"input_norm": 2 * h * act_bytes, "post_norm": 2 * h * act_bytes,
            "rope": 2 * (shape.q_dim + shape.kv_dim) / tp * act_bytes,
            "act": 3 * inter / tp * act_bytes, "add": 3 * h * act_bytes}


class GpuOps:
    """The operator formulas for one (hardware, calibration); times in seconds."""

    def __init__(self, hardware: HardwareProfile, cal: Calibration) -> None:
        self.hw, self.cal = hardware, cal
        self._peak = hardware.peak_tflops * 1e12
        self._hbm = hardware.hbm_bandwidth_gb_s * 1e9

    def gemm(self, m, k: float, n: float, act_bytes: float, weight_bytes: float) -> np.ndarray:
        """One GEMM of ``m`` tokens (scalar or array) against a ``k x n`` weight shard."""
        c = self.cal
        m = np.asarray(m, dtype=float)
        eff = c.gemm_eff_max * m / (m + c.gemm_m_half) * n / (n + c.gemm_n_half)
        compute = 2 * m * k * n / (self._peak * np.maximum(eff, 1e-9))
        memory = (k * n * weight_bytes + m * (k + n) * act_bytes) / (self._hbm * c.bw_eff)
        return np.where(m > 0, c.gemm_floor_us * 1e-6 + np.maximum(compute, memory), 0.0)

    def tokenwise(self, m, bytes_per_token: float, op: str) -> np.ndarray:
        """A token-wise kernel (``op`` of :data:`TOKENWISE`) moving ``bytes_per_token`` per token."""
        c = self.cal
        m = np.asarray(m, dtype=float)
        eff = getattr(c, TOKENWISE_EFF[op])
        return np.where(m > 0, c.tokenwise_floor_us * 1e-6 + m * bytes_per_token / (self._hbm * eff), 0.0)

    def attention(self, flops: float, nbytes: float) -> float:
        """One layer's attention call(s) of a step: ``flops`` and KV/QO ``nbytes`` on one rank."""
        c = self.cal
        return c.gemm_floor_us * 1e-6 + max(flops / (self._peak * c.gemm_eff_max), nbytes / (self._hbm * c.bw_eff))

    def allreduce(self, nbytes, tp: int) -> np.ndarray:
        if tp <= 1:
            return np.zeros_like(np.asarray(nbytes, dtype=float))
        link = self.hw.link_bandwidth_gb_s * 1e9 * self.cal.link_eff
        nbytes = np.asarray(nbytes, dtype=float)
        return np.where(nbytes > 0, self.hw.link_latency_us * 1e-6 + 2 * (tp - 1) / tp * nbytes / link, 0.0)

    def host(self, num_seqs) -> np.ndarray:
        return (self.cal.host_step_us + self.cal.host_per_seq_us * np.asarray(num_seqs, dtype=float)) * 1e-6

    def layer_op(self, op: str, m, shape: ModelShape, tp: int, act_bytes: float, weight_bytes: float) -> np.ndarray:
        """One decoder-layer operator (a name of :data:`GEMMS` or :data:`TOKENWISE`) for ``m`` tokens."""
        if op in GEMMS:
            k, n = gemm_dims(shape, tp)[op]
            return self.gemm(m, k, n, act_bytes, weight_bytes)
        return self.tokenwise(m, tokenwise_bytes_per_token(shape, tp, act_bytes)[op], op)

    def layer(self, m, shape: ModelShape, tp: int, act_bytes: float, weight_bytes: float) -> np.ndarray:
        """A decoder layer's linears and token-wise kernels (attention and all-reduces apart)."""
        return functools.reduce(operator.add, (self.layer_op(op, m, shape, tp, act_bytes, weight_bytes)
                                               for op in GEMMS + TOKENWISE))
