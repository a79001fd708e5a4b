"""A step-time cost model calibrated online from measured step times.

``t(step) ~ c0 + c1 * prefill_tokens + c2 * decode_seqs + c3 * attended_context``, fitted by
(ridge-regularised) least squares with non-negative coefficients over every step seen so far. Shared by every plugin that needs
to predict how long a step, or recomputing a sequence, would take.
"""

from __future__ import annotations

import itertools
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


_UPPER = np.triu_indices(4)  # made once: np.triu_indices costs more than the solve it serves
_LOWER = (_UPPER[1], _UPPER[0])
#: the active set (which coefficients are free) -> their indices and the sub-matrix's index, made once
_ACTIVE = {mask: (np.flatnonzero(mask), np.ix_(np.flatnonzero(mask), np.flatnonzero(mask)))
           for mask in itertools.product((False, True), repeat=4)}


class StepCostModel:
    """Online least-squares fit of step time (seconds) on :class:`StepFeatures`.

    The fit is ridge-regularised towards the prior, so a term the steps so far cannot determine
    (e.g. prefill cost before any prefill was measured) keeps its prior value instead of 0.

    Robust to what CPU measurements look like: the first ``warmup_steps`` steps (lazy
    initialisation) are ignored, a step slower than ``outlier_factor`` x its prediction (another
    process took the cores) is down-weighted, old steps fade by ``decay`` per step (the machine's
    load drifts), and the coefficients are kept non-negative (time never falls with more work).

    Cost: policies read the coefficients every step and a simulated run has hundreds of thousands
    of steps, so the normal equations are kept as plain floats (10 sums of the symmetric 4 x 4
    matrix, 4 of the right-hand side) and solved by an unrolled Cholesky factorisation; numpy's
    active-set solve is the fallback when a coefficient comes out negative or the system is
    nearly singular. Both solve the same equations: they differ only in rounding.
    """

    def __init__(self, prior_s_per_token: float = 1e-3, ridge: float = 1e-6, warmup_steps: int = 1,
                 outlier_factor: float = 3.0, decay: float = 0.995, bytes_per_block: int = 0) -> None:
        # The prior (before any measurement): 1 ms per computed token.
        self._ridge = ridge
        self._xtx = [0.0] * 10  # upper triangle of sum w x x^T, row by row: 00 01 02 03 11 12 13 22 23 33
        self._xty = [0.0] * 4
        self._prior = (0.0, float(prior_s_per_token), float(prior_s_per_token), 0.0)
        self._fitted = self._prior
        self._stale = False  # observations since the last solve: solved when next read
        self.warmup_steps = warmup_steps
        self.outlier_factor = outlier_factor
        self.decay = decay
        self.num_observations = 0
        self._seen = 0
        # The host link: bytes per KV block (the executor's), copy bandwidth (set by the stack once it
        # knows it: configured, the time model's, or measured).
        self.bytes_per_block = bytes_per_block
        self.swap_bytes_per_s: float | None = None

    def observe(self, features: StepFeatures, seconds: float) -> None:
        """Add one measured step."""
        self.observe_counts(features.prefill_tokens, features.decode_seqs, features.attended_context, seconds)

    def observe_counts(self, prefill_tokens: int, decode_seqs: int, attended_context: int, seconds: float) -> None:
        """:meth:`observe` of a step given by its features' numbers (the engine's, once per step:
        no :class:`StepFeatures` made)."""
        self._seen += 1
        if self._seen <= self.warmup_steps:
            return
        x1, x2, x3 = float(prefill_tokens), float(decode_seqs), attended_context / 1e3
        weight = 1.0
        if self.num_observations >= 8:
            if self._stale and self.num_observations % 8 == 0:
                self._coef  # noqa: B018 - refresh the fit the outlier test compares with, every 8 steps
            c0, c1, c2, c3 = self._fitted
            expected = max(c0 + c1 * x1 + c2 * x2 + c3 * x3, 1e-6)
            if seconds > self.outlier_factor * expected:
                weight = self.outlier_factor * expected / seconds
        d, s, y = self.decay, self._xtx, self._xty
        w1, w2, w3 = weight * x1, weight * x2, weight * x3
        s[0] = s[0] * d + weight
        s[1] = s[1] * d + w1
        s[2] = s[2] * d + w2
        s[3] = s[3] * d + w3
        s[4] = s[4] * d + w1 * x1
        s[5] = s[5] * d + w1 * x2
        s[6] = s[6] * d + w1 * x3
        s[7] = s[7] * d + w2 * x2
        s[8] = s[8] * d + w2 * x3
        s[9] = s[9] * d + w3 * x3
        y[0] = y[0] * d + weight * seconds
        y[1] = y[1] * d + w1 * seconds
        y[2] = y[2] * d + w2 * seconds
        y[3] = y[3] * d + w3 * seconds
        self.num_observations += 1
        self._stale = self.num_observations >= 8

    @property
    def _coef(self) -> tuple[float, float, float, float]:
        if self._stale:  # solving lazily: a run that never asks pays for no solve per step
            coef = self._cholesky_solve()
            if coef is None or min(coef) < 0:
                c0, c1, c2, c3 = map(float, self._non_negative_solve())
                coef = (c0, c1, c2, c3)
            self._fitted = coef
            self._stale = False
        return self._fitted

    def _system(self) -> tuple[list[float], list[float]]:
        """The regularised normal equations: the 10 upper-triangle entries and the right-hand side."""
        r, s, prior = self._ridge, self._xtx, self._prior
        a = list(s)
        for i in (0, 4, 7, 9):  # the diagonal
            a[i] += r
        return a, [v + r * p for v, p in zip(self._xty, prior)]

    def _cholesky_solve(self) -> tuple[float, float, float, float] | None:
        """Solve the 4 x 4 system (unrolled); None when a pivot has lost (nearly) all its digits."""
        (a00, a01, a02, a03, a11, a12, a13, a22, a23, a33), (b0, b1, b2, b3) = self._system()
        tiny = 1e-10  # a pivot below tiny x its diagonal entry: cancellation, let numpy decide
        if a00 <= 0:
            return None
        l00 = a00 ** 0.5
        l10, l20, l30 = a01 / l00, a02 / l00, a03 / l00
        d1 = a11 - l10 * l10
        if d1 <= tiny * a11:
            return None
        l11 = d1 ** 0.5
        l21, l31 = (a12 - l20 * l10) / l11, (a13 - l30 * l10) / l11
        d2 = a22 - l20 * l20 - l21 * l21
        if d2 <= tiny * a22:
            return None
        l22 = d2 ** 0.5
        l32 = (a23 - l30 * l20 - l31 * l21) / l22
        d3 = a33 - l30 * l30 - l31 * l31 - l32 * l32
        if d3 <= tiny * a33:
            return None
        l33 = d3 ** 0.5
        z0 = b0 / l00
        z1 = (b1 - l10 * z0) / l11
        z2 = (b2 - l20 * z0 - l21 * z1) / l22
        z3 = (b3 - l30 * z0 - l31 * z1 - l32 * z2) / l33
        c3 = z3 / l33
        c2 = (z2 - l32 * c3) / l22
        c1 = (z1 - l21 * c2 - l31 * c3) / l11
        c0 = (z0 - l10 * c1 - l20 * c2 - l30 * c3) / l00
        return c0, c1, c2, c3

    def _non_negative_solve(self) -> np.ndarray:
        """Least squares with coefficients clamped at 0 (active set: drop negatives, refit)."""
        upper, b = self._system()
        a = np.empty((4, 4))
        a[_UPPER] = upper
        a[_LOWER] = upper  # the mirror: the same values, so the same matrix as symmetrising by adding
        rhs = np.array(b)
        coef = np.linalg.solve(a, rhs)
        values = coef.tolist()
        if all(v >= 0 for v in values):  # the usual case: no active set needed
            return coef
        active = tuple(v > 0 for v in values)
        for _ in range(4):
            idx, block = _ACTIVE[active]
            coef = np.zeros(4)
            coef[idx] = np.linalg.solve(a[block], rhs[idx])
            values = coef.tolist()
            if all(v >= 0 for v in values):
                break
            active = tuple(kept and v > 0 for kept, v in zip(active, values))
        return np.maximum(coef, 0.0)

    def predict(self, features: StepFeatures) -> float:
        """Predicted seconds for a step with ``features`` (never negative)."""
        c0, c1, c2, c3 = self._coef
        return max(0.0, c0 + c1 * features.prefill_tokens + c2 * features.decode_seqs
                   + c3 * (features.attended_context / 1e3))

    def recompute_seconds(self, num_tokens: int) -> float:
        """Predicted extra time to recompute ``num_tokens`` tokens of one sequence as prefill."""
        f = StepFeatures(prefill_tokens=num_tokens, attended_context=num_tokens * (num_tokens + 1) // 2)
        return max(0.0, self.predict(f) - self.predict(StepFeatures()))

    def coefficient_vector(self) -> tuple[float, float, float, float]:
        """``(base_s, per_prefill_token_s, per_decode_seq_s, per_1k_attended_s)`` as floats, for
        plugins that evaluate the model in a tight loop."""
        return self._coef

    def swap_seconds(self, num_blocks: int) -> float:
        """Predicted time to copy ``num_blocks`` KV blocks one way between device and host."""
        if not self.swap_bytes_per_s:
            raise ValueError("the cost model has no swap bandwidth (the stack sets it from the executor)")
        return num_blocks * self.bytes_per_block / self.swap_bytes_per_s

    @property
    def coefficients(self) -> dict[str, float]:
        names = ("base_s", "per_prefill_token_s", "per_decode_seq_s", "per_1k_attended_s")
        return dict(zip(names, map(float, self._coef)))
