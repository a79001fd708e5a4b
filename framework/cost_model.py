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
    """Online least-squares fit of step time (seconds) on :class:`StepFeatures`.

    The fit is ridge-regularised towards the prior, so a term the steps so far cannot determine
    (e.g. prefill cost before any prefill was measured) keeps its prior value instead of 0.

    Robust to what CPU measurements look like: the first ``warmup_steps`` steps (lazy
    initialisation) are ignored, a step slower than ``outlier_factor`` x its prediction (another
    process took the cores) is down-weighted, old steps fade by ``decay`` per step (the machine's
    load drifts), and the coefficients are kept non-negative (time never falls with more work).
    """

    def __init__(self, prior_s_per_token: float = 1e-3, ridge: float = 1e-6, warmup_steps: int = 1,
                 outlier_factor: float = 3.0, decay: float = 0.995) -> None:
        # The prior (before any measurement): 1 ms per computed token.
        self._ridge = ridge
        self._xtx = np.zeros((4, 4))
        self._xty = np.zeros(4)
        self._prior = np.array([0.0, prior_s_per_token, prior_s_per_token, 0.0])
        self._fitted = self._prior.copy()
        self._stale = False  # observations since the last solve: solved when next read
        self.warmup_steps = warmup_steps
        self.outlier_factor = outlier_factor
        self.decay = decay
        self.num_observations = 0
        self._seen = 0
        # The host link, set by the stack from the executor (bytes per KV block, copy bandwidth).
        self.bytes_per_block = 0
        self.swap_bytes_per_s: float | None = None

    def observe(self, features: StepFeatures, seconds: float) -> None:
        """Add one measured step."""
        self._seen += 1
        if self._seen <= self.warmup_steps:
            return
        x = features.vector()
        weight = 1.0
        if self.num_observations >= 8:
            if self._stale and self.num_observations % 8 == 0:
                self._coef  # noqa: B018 - refresh the fit the outlier test compares with, every 8 steps
            expected = max(float(x @ self._fitted), 1e-6)
            if seconds > self.outlier_factor * expected:
                weight = self.outlier_factor * expected / seconds
        self._xtx *= self.decay
        self._xty *= self.decay
        wx = weight * x
        self._xtx += np.outer(wx, x)
        self._xty += wx * seconds
        self.num_observations += 1
        self._stale = self.num_observations >= 8

    @property
    def _coef(self) -> np.ndarray:
        if self._stale:  # solving lazily: a run that never asks pays for no solve per step
            self._fitted = self._non_negative_solve()
            self._stale = False
        return self._fitted

    def _non_negative_solve(self) -> np.ndarray:
        """Least squares with coefficients clamped at 0 (active set: drop negatives, refit)."""
        a = self._xtx + np.eye(4) * self._ridge
        rhs = self._xty + self._ridge * self._prior
        coef = np.linalg.solve(a, rhs)
        if (coef >= 0).all():  # the usual case: no active set needed
            return coef
        active = coef > 0
        for _ in range(4):
            idx = np.flatnonzero(active)
            coef = np.zeros(4)
            coef[idx] = np.linalg.solve(a[np.ix_(idx, idx)], rhs[idx])
            if (coef >= 0).all():
                break
            active &= coef > 0
        return np.maximum(coef, 0.0)

    def predict(self, features: StepFeatures) -> float:
        """Predicted seconds for a step with ``features`` (never negative)."""
        return max(0.0, float(features.vector() @ self._coef))

    def recompute_seconds(self, num_tokens: int) -> float:
        """Predicted extra time to recompute ``num_tokens`` tokens of one sequence as prefill."""
        f = StepFeatures(prefill_tokens=num_tokens, attended_context=num_tokens * (num_tokens + 1) // 2)
        return max(0.0, self.predict(f) - self.predict(StepFeatures()))

    def coefficient_vector(self) -> tuple[float, float, float, float]:
        """``(base_s, per_prefill_token_s, per_decode_seq_s, per_1k_attended_s)`` as floats, for
        plugins that evaluate the model in a tight loop."""
        return tuple(float(c) for c in self._coef)  # type: ignore[return-value]

    def swap_seconds(self, num_blocks: int) -> float:
        """Predicted time to copy ``num_blocks`` KV blocks one way between device and host."""
        if not self.swap_bytes_per_s:
            raise ValueError("the cost model has no swap bandwidth (the stack sets it from the executor)")
        return num_blocks * self.bytes_per_block / self.swap_bytes_per_s

    @property
    def coefficients(self) -> dict[str, float]:
        names = ("base_s", "per_prefill_token_s", "per_decode_seq_s", "per_1k_attended_s")
        return dict(zip(names, map(float, self._coef)))

