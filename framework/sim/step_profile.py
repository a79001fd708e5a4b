"""Fitted step-time profiles: the features, the least-squares fit, and the profile file.

A profile is a piecewise-linear model of step time in the :class:`StepWork` features (like
DistServe's simulator fits its latency model), fitted on steps measured on the real engine by
``servelab profile``. The file records where it came from (model, dtype, backend, threads,
machine), so a profile used for another model can be flagged.

File format ``servelab-profile/2`` adds knots on the decode term (``decode_knots``); a
``servelab-profile/1`` file (prefill knots only) still loads and predicts as it did.
"""

from __future__ import annotations

import json
import os
import platform
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from servelab.core.errors import ConfigError
from servelab.core.step_work import StepWork

FORMAT = "servelab-profile/2"
FORMATS = ("servelab-profile/1", FORMAT)  # what load() reads; /1 has no decode knots
DEFAULT_KNOTS = (128, 512)
# A CPU's cost per decoding sequence changes with the batch (the probe's batch 1 -> 2 -> 4 steps
# are not on one line with 16 -> 64); one linear term overpriced batch 1 by ~10%. The probe
# decodes at batches 1, 2, 4, 8, ...: knots at 2 and 4 let it price each small batch itself.
DEFAULT_DECODE_KNOTS = (2, 4, 16)


def feature_names(knots, decode_knots=()) -> list[str]:
    return (["base", "prefill_tokens"] + [f"prefill_over_{k}" for k in knots] + ["decode_seqs"]
            + [f"decode_over_{k}" for k in decode_knots] + ["attended_k", "context_k", "swap_blocks", "copy_blocks"])


def feature_vector(work: StepWork, knots, decode_knots=()) -> list[float]:
    """Per step: a constant; prompt tokens computed (piecewise: the per-token cost may change past
    each knot); decoding sequences (piecewise the same way past each decode knot); attention work
    and KV read (thousands of positions); block copies. Prefill and decode are separate terms
    (DistServe's split), so the probe can tell a token's cost from a sequence's. Speculative
    drafts a verify computes are priced as prompt tokens (the probe never drafts)."""
    p, d = work.prefill_tokens + work.draft_tokens, work.decode_seqs
    return ([1.0, p] + [max(0, p - k) for k in knots] + [d] + [max(0, d - k) for k in decode_knots]
            + [work.attended / 1e3, work.context_tokens / 1e3, work.swap_out_blocks + work.swap_in_blocks,
               work.copy_blocks])


@dataclass
class StepProfile:
    """Coefficients (seconds per feature unit) plus provenance."""

    coefficients: list[float]
    knots: tuple[int, ...] = DEFAULT_KNOTS
    decode_knots: tuple[int, ...] = ()
    min_step_s: float = 0.0
    source: dict = field(default_factory=dict)  # model, dtype, backend, threads, machine, ...
    fit: dict = field(default_factory=dict)  # num_steps, r2, mean_abs_pct_error
    samples: list = field(default_factory=list)  # the measured steps: feature vector + seconds

    def feature_index(self, feature: str) -> int:
        return feature_names(self.knots, self.decode_knots).index(feature)

    def set_coefficient(self, feature: str, seconds: float) -> None:
        """Price one feature directly (e.g. a block copy from a measured bandwidth)."""
        self.coefficients[self.feature_index(feature)] = float(seconds)

    def predict(self, work: StepWork) -> float:
        t = float(np.dot(self.coefficients, feature_vector(work, self.knots, self.decode_knots)))
        return max(t, self.min_step_s)

    def to_json(self) -> dict:
        return {"format": FORMAT, "features": feature_names(self.knots, self.decode_knots),
                "coefficients": self.coefficients, "knots": list(self.knots), "decode_knots": list(self.decode_knots),
                "min_step_s": self.min_step_s, "source": self.source, "fit": self.fit, "samples": self.samples}

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_json(), indent=2) + "\n")
        return path

    @classmethod
    def load(cls, path: str | Path) -> "StepProfile":
        path = Path(path)
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise ConfigError(f"time_model.path={str(path)!r}: cannot read a profile there ({exc}); "
                              "make one with `servelab profile [overrides]`") from None
        if data.get("format") not in FORMATS:
            raise ConfigError(f"{path}: not a servelab profile (format {data.get('format')!r}, expected one of "
                              f"{list(FORMATS)})")
        try:
            knots = tuple(int(k) for k in data["knots"])
            decode_knots = tuple(int(k) for k in data.get("decode_knots", ())) if data["format"] == FORMAT else ()
            coefficients = [float(c) for c in data["coefficients"]]
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"{path}: a malformed profile ({type(exc).__name__}: {exc}); "
                              "make a new one with `servelab profile [overrides]`") from None
        names = feature_names(knots, decode_knots)
        if data.get("features", names) != names or len(coefficients) != len(names):
            raise ConfigError(f"{path}: its features {data.get('features')} with {len(coefficients)} coefficients "
                              f"do not match its knots (expected {names}); make a new one with `servelab profile`")
        return cls(coefficients=coefficients, knots=knots, decode_knots=decode_knots,
                   min_step_s=float(data.get("min_step_s", 0.0)), source=data.get("source", {}),
                   fit=data.get("fit", {}), samples=data.get("samples", []))


def fit_profile(works: list[StepWork], seconds: list[float], knots=DEFAULT_KNOTS, ridge: float = 1e-9,
                source: dict | None = None, decode_knots=DEFAULT_DECODE_KNOTS) -> StepProfile:
    """Least squares of step time on the features (a small ridge keeps unseen features at 0)."""
    if len(works) < 8:
        raise ValueError(f"a profile needs at least 8 measured steps, got {len(works)}")
    x = np.array([feature_vector(w, knots, decode_knots) for w in works])
    y = np.asarray(seconds, dtype=float)
    scale = np.maximum(np.abs(x).max(axis=0), 1e-12)  # columns to unit range: the ridge treats all alike
    # Relative error is what matters (a 4 ms decode step mispriced by 3 ms is as wrong as a 400 ms
    # prefill by 300 ms): each step weighs 1 / its duration.
    weight = 1.0 / np.maximum(y, 1e-6)
    xs = x / scale * weight[:, None]
    # Costs are non-negative, except the knots' slope changes (a CPU gets cheaper per token as the
    # batch grows): active-set least squares with only those free in sign.
    free = np.array([name.startswith(("prefill_over_", "decode_over_")) for name in feature_names(knots, decode_knots)])
    a = xs.T @ xs + ridge * len(y) * np.eye(x.shape[1])
    b = xs.T @ (y * weight)
    active = np.ones(x.shape[1], dtype=bool)
    for _ in range(x.shape[1]):
        idx = np.flatnonzero(active)
        coef = np.zeros(x.shape[1])
        coef[idx] = np.linalg.solve(a[np.ix_(idx, idx)], b[idx])
        negative = (coef < 0) & ~free
        if not negative.any():
            break
        active &= ~negative
    coef = coef / scale
    coef *= y.sum() / max(float(np.maximum(x @ coef, 0.0).sum()), 1e-12)  # unbiased in total time
    pred = np.maximum(x @ coef, 0.0)
    resid = y - pred
    r2 = 1.0 - float(resid @ resid) / max(float(((y - y.mean()) ** 2).sum()), 1e-30)
    mape = float(np.mean(np.abs(resid) / np.maximum(y, 1e-9)))
    total_err = float(pred.sum() / y.sum() - 1.0)
    return StepProfile(coefficients=[float(c) for c in coef], knots=tuple(knots), decode_knots=tuple(decode_knots),
                       min_step_s=float(y.min()) * 0.5,
                       source=dict(source or {}),
                       fit={"num_steps": len(y), "r2": r2, "mean_abs_pct_error": mape,
                            "total_time_error": total_err, "total_s": float(y.sum())})


def machine_description() -> dict:
    """Where a profile was measured."""
    import torch  # noqa: PLC0415 - torch (the simulator itself runs without it)

    return {"hostname": platform.node(), "processor": cpu_model(), "cores": os.cpu_count(),
            "platform": platform.platform(), "torch": torch.__version__,
            "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}


def cpu_model(default: str | None = None) -> str:
    """The CPU's model name from ``/proc/cpuinfo``, else ``default`` (else what platform says)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return default if default is not None else (platform.processor() or "unknown")
