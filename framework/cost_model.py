"""A step-time cost model calibrated online from measured step times.

``t(step) ~ c0 + c1 * prefill_tokens + c2 * decode_seqs + c3 * attended_context``, fitted by
(ridge-regularised) least squares with non-negative coefficients over every step seen so far. Shared by every plugin that needs
to predict how long a step, or recomputing a sequence, would take.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class StepFeatures:
    """What a step computes: prompt/recompute tokens, decoding sequences, and the attention work
    (sum over computed tokens of the context they attend to)."""

    prefill_tokens: int = 0
    decode_seqs: int = 0
    attended_context: int = 0

    def vector(self) -> np.ndarray:
        return np.array([1.0, self.prefill_tokens, self.decode_seqs, self.attended_context / 1e3])


class StepCostModel:
    """Online least-squares fit of step time (seconds) on :class:`StepFeatures`."""

    def __init__(self, prior_s_per_token: float = 1e-3, ridge: float = 1e-6) -> None:
        # The prior (before any measurement): 1 ms per computed token.
        self._xtx = np.eye(4) * ridge
        self._xty = np.zeros(4)
        self._coef = np.array([0.0, prior_s_per_token, prior_s_per_token, 0.0])
        self.num_observations = 0
        # The host link, set by the stack from the executor (bytes per KV block, copy bandwidth).
        self.bytes_per_block = 0
        self.swap_bytes_per_s: float | None = None

    def observe(self, features: StepFeatures, seconds: float) -> None:
        """Add one measured step."""
        x = features.vector()
        self._xtx += np.outer(x, x)
        self._xty += x * seconds
        self.num_observations += 1
        if self.num_observations >= 8:
            self._coef = _nonnegative_solve(self._xtx, self._xty)

    def predict(self, features: StepFeatures) -> float:
        """Predicted seconds for a step with ``features`` (never negative)."""
        return max(0.0, float(features.vector() @ self._coef))

    def recompute_seconds(self, num_tokens: int) -> float:
        """Predicted extra time to recompute ``num_tokens`` tokens of one sequence as prefill."""
        f = StepFeatures(prefill_tokens=num_tokens, attended_context=num_tokens * (num_tokens + 1) // 2)
        return max(0.0, self.predict(f) - self.predict(StepFeatures()))

    def swap_seconds(self, num_blocks: int) -> float:
        """Predicted time to copy ``num_blocks`` KV blocks one way between device and host."""
        if not self.swap_bytes_per_s:
            raise ValueError("the cost model has no swap bandwidth (the stack sets it from the executor)")
        return num_blocks * self.bytes_per_block / self.swap_bytes_per_s

    @property
    def coefficients(self) -> dict[str, float]:
        names = ("base_s", "per_prefill_token_s", "per_decode_seq_s", "per_1k_attended_s")
        return dict(zip(names, map(float, self._coef)))


def _nonnegative_solve(xtx: np.ndarray, xty: np.ndarray) -> np.ndarray:
    """Least squares from the normal equations with every coefficient >= 0 (more work never takes
    less time; noisy step times otherwise give negative per-token costs). Active set: drop the
    most negative coefficient and refit the rest until none is negative."""
    free = list(range(len(xty)))
    coef = np.zeros(len(xty))
    while free:
        sub = np.linalg.solve(xtx[np.ix_(free, free)], xty[free])
        if (sub >= 0).all():
            coef[free] = sub
            break
        free.pop(int(np.argmin(sub)))
    return coef
