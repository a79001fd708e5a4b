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
#: (i, j) -> the position of entry ij of the symmetric 4 x 4 matrix in its upper triangle, row by row
_POS = [[(min(i, j) * (7 - min(i, j))) // 2 + max(i, j) for j in range(4)] for i in range(4)]
_TINY = 1e-10  # a Cholesky pivot below _TINY x its diagonal entry: cancellation, let numpy decide
#: How far below the outlier threshold a step must be, by a pure-Python estimate of numpy's
#: active-set solve, for the outlier test to do without numpy's: the two solve the same equations
#: and differ in rounding, far below a factor of 2 when no Cholesky pivot is tiny.
_ESTIMATE_SLACK = 2.0
_EXACT = 1.0  # the slack of an exact fit

Coefficients = tuple[float, float, float, float]


class CostFit:
    """The fit of a :class:`StepCostModel` to the steps it had seen at one moment (its normal
    equations, kept as they were), solved when first read: a policy that may not need the
    coefficients takes one of these (:meth:`StepCostModel.fit`) and reads :attr:`coefficients`
    only when a decision depends on them."""

    __slots__ = ("_model", "_sums", "_coef", "_probe")

    def __init__(self, model: StepCostModel, sums: tuple[float, ...], coef: Coefficients | None = None) -> None:
        self._model, self._sums = model, sums
        self._coef = coef  # the exact fit, once known
        self._probe: tuple[float, ...] | None = None if coef is None else (*coef, _EXACT)  # see probe()

    @property
    def coefficients(self) -> Coefficients:
        """``(base_s, per_prefill_token_s, per_decode_seq_s, per_1k_attended_s)``: the exact fit
        (the unrolled Cholesky's when non-negative, else numpy's active-set solve)."""
        coef = self._coef
        if coef is None:
            c0, c1, c2, c3, slack = self._probe or self.probe()
            coef = self._coef = (c0, c1, c2, c3) if slack == _EXACT else self._active_set_solve()
        return coef

    def probe(self) -> tuple[float, ...]:
        """What the outlier test compares a step with first: ``(c0, c1, c2, c3, slack)``, the exact
        fit with slack 1, or a pure-Python estimate of numpy's active-set solve with slack
        :data:`_ESTIMATE_SLACK`: a step whose ``seconds * slack`` stays within the threshold by
        it is no outlier; any other is tested with :meth:`outlier_weight`."""
        probe = self._probe
        if probe is None:
            model = self._model
            probe = _cholesky_probe(self._sums, model._ridge, model._prior)
            if probe is None:  # a tiny pivot, or an unusual sign pattern
                estimate = _estimate_non_negative(*model._system(self._sums))
                if estimate is not None:
                    probe = (*estimate, _ESTIMATE_SLACK)
                else:
                    coef = self._coef = self._active_set_solve()
                    probe = (*coef, _EXACT)
            self._probe = probe
        return probe

    def outlier_weight(self, x1: float, x2: float, x3: float, seconds: float, factor: float) -> float:
        """The weight of a step of ``seconds`` with features ``x`` by the exact fit: 1, or less when
        it took more than ``factor`` x its prediction."""
        c0, c1, c2, c3 = self.coefficients
        expected = max(c0 + c1 * x1 + c2 * x2 + c3 * x3, 1e-6)
        return factor * expected / seconds if seconds > factor * expected else 1.0

    def _active_set_solve(self) -> Coefficients:
        """numpy's active-set solve (:meth:`StepCostModel._non_negative_solve`), as floats."""
        model = self._model
        c0, c1, c2, c3 = map(float, model._non_negative_solve(*model._system(self._sums)))
        return c0, c1, c2, c3


def _cholesky_probe(sums: tuple[float, ...], ridge: float, prior: Coefficients) -> tuple[float, ...] | None:
    """Solve the regularised normal equations of ``sums`` by an unrolled Cholesky factorisation:
    :meth:`CostFit.probe`'s answer when the coefficients are non-negative (the exact fit) or only
    the last is negative (an estimate of numpy's active-set solve, which then drops it: the first
    three solved with the leading 3 x 3 block of the same factor); None in any other case or when
    a pivot has lost (nearly) all its digits."""
    s00, s01, s02, s03, s11, s12, s13, s22, s23, s33, y0, y1, y2, y3 = sums
    a00, a11, a22, a33 = s00 + ridge, s11 + ridge, s22 + ridge, s33 + ridge
    tiny = _TINY
    if a00 <= 0:
        return None
    l00 = a00 ** 0.5
    l10, l20, l30 = s01 / l00, s02 / l00, s03 / l00
    d1 = a11 - l10 * l10
    if d1 <= tiny * a11:
        return None
    l11 = d1 ** 0.5
    l21, l31 = (s12 - l20 * l10) / l11, (s13 - l30 * l10) / l11
    d2 = a22 - l20 * l20 - l21 * l21
    if d2 <= tiny * a22:
        return None
    l22 = d2 ** 0.5
    l32 = (s23 - l30 * l20 - l31 * l21) / l22
    d3 = a33 - l30 * l30 - l31 * l31 - l32 * l32
    if d3 <= tiny * a33:
        return None
    l33 = d3 ** 0.5
    p0, p1, p2, p3 = prior
    z0 = (y0 + ridge * p0) / l00
    z1 = (y1 + ridge * p1 - l10 * z0) / l11
    z2 = (y2 + ridge * p2 - l20 * z0 - l21 * z1) / l22
    z3 = (y3 + ridge * p3 - l30 * z0 - l31 * z1 - l32 * z2) / l33
    c3 = z3 / l33
    c2 = (z2 - l32 * c3) / l22
    c1 = (z1 - l21 * c2 - l31 * c3) / l11
    c0 = (z0 - l10 * c1 - l20 * c2 - l30 * c3) / l00
    if not min(c0, c1, c2, c3) < 0:
        return c0, c1, c2, c3, _EXACT
    if not (c3 < 0 < c0 and c1 > 0 and c2 > 0):
        return None
    c2 = z2 / l22
    c1 = (z1 - l21 * c2) / l11
    c0 = (z0 - l10 * c1 - l20 * c2) / l00
    return (c0, c1, c2, 0.0, _ESTIMATE_SLACK) if c0 >= 0 and c1 >= 0 and c2 >= 0 else None


def _estimate_non_negative(a: list[float], b: list[float]) -> Coefficients | None:
    """:meth:`StepCostModel._non_negative_solve`'s active-set loop with each system solved by a
    pure-Python Cholesky factorisation: the same fit up to rounding; None when a pivot is tiny."""
    coef = _subset_solve(a, b, (0, 1, 2, 3))
    if coef is None:
        return None
    if min(coef) >= 0:
        return coef
    active = tuple(v > 0 for v in coef)
    for _ in range(4):
        idx = tuple(i for i in range(4) if active[i])
        coef = _subset_solve(a, b, idx) if idx else None
        if coef is None:
            return None
        if min(coef) >= 0:
            break
        active = tuple(kept and v > 0 for kept, v in zip(active, coef))
    c0, c1, c2, c3 = (max(v, 0.0) for v in coef)
    return (c0, c1, c2, c3) if c0 >= 0 and c1 >= 0 and c2 >= 0 and c3 >= 0 else None  # no nan


def _subset_solve(a: list[float], b: list[float], idx: tuple[int, ...]) -> Coefficients | None:
    """Solve the equations of the coefficients ``idx`` (the others 0) by Cholesky; None when a pivot is tiny."""
    n = len(idx)
    low = [[0.0] * n for _ in range(n)]
    for r in range(n):
        for c in range(r + 1):
            v = a[_POS[idx[r]][idx[c]]] - sum(low[r][k] * low[c][k] for k in range(c))
            if r == c:
                diagonal = a[_POS[idx[r]][idx[r]]]
                if v <= _TINY * diagonal or diagonal <= 0:
                    return None
                low[r][r] = v ** 0.5
            else:
                low[r][c] = v / low[c][c]
    z = [0.0] * n
    for r in range(n):
        z[r] = (b[idx[r]] - sum(low[r][k] * z[k] for k in range(r))) / low[r][r]
    x = [0.0] * n
    for r in reversed(range(n)):
        x[r] = (z[r] - sum(low[k][r] * x[k] for k in range(r + 1, n))) / low[r][r]
    coef = [0.0] * 4
    for i, v in zip(idx, x):
        coef[i] = v
    return coef[0], coef[1], coef[2], coef[3]


class StepCostModel:
    """Online least-squares fit of step time (seconds) on :class:`StepFeatures`.

    The fit is ridge-regularised towards the prior, so a term the steps so far cannot determine
    (e.g. prefill cost before any prefill was measured) keeps its prior value instead of 0.

    Robust to what CPU measurements look like: the first ``warmup_steps`` steps (lazy
    initialisation) are ignored, a step slower than ``outlier_factor`` x its prediction (another
    process took the cores) is down-weighted, old steps fade by ``decay`` per step (the machine's
    load drifts), and the coefficients are kept non-negative (time never falls with more work).

    Cost: policies read the coefficients every step and a simulated run has hundreds of thousands
    of steps, so the normal equations are kept as plain floats (a tuple of the 10 sums of the
    symmetric 4 x 4 matrix and the 4 of the right-hand side: a :class:`CostFit` holds them as they
    were, for nothing) and solved by an unrolled Cholesky factorisation; numpy's active-set solve is
    the fallback when a coefficient comes out negative or the system is nearly singular. Both solve
    the same equations: they differ only in rounding. The fit is refreshed (the outlier test's
    reference) when it is read and every 8 steps, and solved only when its coefficients are
    needed: the outlier test of a step far from the threshold trusts a pure-Python estimate.
    """

    def __init__(self, prior_s_per_token: float = 1e-3, ridge: float = 1e-6, warmup_steps: int = 1,
                 outlier_factor: float = 3.0, decay: float = 0.995, bytes_per_block: int = 0) -> None:
        # The prior (before any measurement): 1 ms per computed token.
        self._ridge = ridge
        # sum w x x^T (upper triangle, row by row: 00 01 02 03 11 12 13 22 23 33), then sum w x y (0 1 2 3)
        self._sums = (0.0,) * 14
        self._prior = (0.0, float(prior_s_per_token), float(prior_s_per_token), 0.0)
        self._fit = CostFit(self, self._sums, self._prior)
        self._stale = False  # observations since the last refresh: refreshed when next read
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
        n = self.num_observations
        weight = 1.0
        if n >= 8:
            if self._stale and n % 8 == 0:  # refresh the fit the outlier test compares with, every 8 steps
                self._fit = CostFit(self, self._sums)
                self._stale = False
            fit, factor = self._fit, self.outlier_factor
            c0, c1, c2, c3, slack = fit._probe or fit.probe()
            if seconds * slack > factor * max(c0 + c1 * x1 + c2 * x2 + c3 * x3, 1e-6):  # maybe an outlier:
                weight = fit.outlier_weight(x1, x2, x3, seconds, factor)  # ask the exact fit
        d = self.decay
        s0, s1, s2, s3, s4, s5, s6, s7, s8, s9, y0, y1, y2, y3 = self._sums
        w1, w2, w3 = weight * x1, weight * x2, weight * x3
        self._sums = (s0 * d + weight, s1 * d + w1, s2 * d + w2, s3 * d + w3, s4 * d + w1 * x1,
                      s5 * d + w1 * x2, s6 * d + w1 * x3, s7 * d + w2 * x2, s8 * d + w2 * x3, s9 * d + w3 * x3,
                      y0 * d + weight * seconds, y1 * d + w1 * seconds, y2 * d + w2 * seconds, y3 * d + w3 * seconds)
        self.num_observations = n = n + 1
        self._stale = n >= 8

    def fit(self) -> CostFit:
        """The fit to the steps seen so far (refreshed if steps came since the last one), solved
        when its :attr:`CostFit.coefficients` are first read. Reading the fit, solved or not, makes
        it the outlier test's reference, as reading the coefficients does."""
        if self._stale:
            self._fit = CostFit(self, self._sums)
            self._stale = False
        return self._fit

    @property
    def _coef(self) -> tuple[float, float, float, float]:
        return self.fit().coefficients

    def _system(self, sums: tuple[float, ...]) -> tuple[list[float], list[float]]:
        """The regularised normal equations: the 10 upper-triangle entries and the right-hand side."""
        r, prior = self._ridge, self._prior
        a = list(sums[:10])
        for i in (0, 4, 7, 9):  # the diagonal
            a[i] += r
        return a, [v + r * p for v, p in zip(sums[10:], prior)]

    @staticmethod
    def _non_negative_solve(upper: list[float], b: list[float]) -> np.ndarray:
        """Least squares with coefficients clamped at 0 (active set: drop negatives, refit)."""
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
