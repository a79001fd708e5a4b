"""Token lengths drawn from a workload's length spec (``dist``: fixed / uniform / lognormal, with
``mean``, ``sigma``, ``min``, ``max``): what ``synthetic``, its ``clients`` and ``chat_sessions``
share."""

from __future__ import annotations

import numpy as np

from servelab.core.errors import WorkloadError


def draw_lengths(rng: np.random.Generator, spec, n: int, key: str) -> np.ndarray:
    """``n`` lengths from ``spec`` (the config node at ``workload.<key>``; ``key`` names it in errors)."""
    dist = getattr(spec.dist, "value", spec.dist)
    if dist == "fixed":  # the value is `mean`; min/max do not apply
        if spec.mean < 1:
            raise WorkloadError(f"workload.{key}.mean={spec.mean} must be >= 1 for a fixed length")
        return np.full(n, int(spec.mean))
    if spec.min < 1 or spec.max < spec.min:
        raise WorkloadError(f"workload.{key}: need 1 <= min <= max, got min={spec.min} max={spec.max}")
    if dist == "uniform":
        values = rng.integers(spec.min, spec.max + 1, size=n)
    elif dist == "lognormal":
        values = np.rint(rng.lognormal(np.log(spec.mean), spec.sigma, size=n))
    else:
        raise WorkloadError(f"workload.{key}.dist={dist!r} is not one of uniform, lognormal, fixed")
    return np.clip(values, spec.min, spec.max).astype(int)
