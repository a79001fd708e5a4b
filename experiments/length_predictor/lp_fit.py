"""Fit a softmax classifier over output-length buckets (numpy, full batch, deterministic).

Features are standardised for the fit (their scales differ by orders of magnitude: histogram
bins against the log length) and the standardisation is folded back into the weights, so the
predictor multiplies raw features by one matrix."""

from __future__ import annotations

import numpy as np


def fit(x: np.ndarray, y: np.ndarray, num_classes: int, l2: float, steps: int = 300, lr: float = 0.05) -> np.ndarray:
    """Weights ``[dim, num_classes]`` for raw features ``x`` (its last column the constant bias):
    minimise mean cross-entropy + ``l2/2 * |W|^2`` over standardised features (the bias row not
    penalised), by Adam from zeros: the same data gives the same weights."""
    mu = x[:, :-1].mean(axis=0)
    sd = x[:, :-1].std(axis=0)
    sd = np.where(sd > 0, sd, 1.0)  # a constant column keeps weight 0 (its gradient is 0)
    z = x.copy()
    z[:, :-1] = (x[:, :-1] - mu) / sd
    w = _adam_softmax(z, y, num_classes, l2, steps, lr)
    raw = w.copy()
    raw[:-1] = w[:-1] / sd[:, None]
    raw[-1] = w[-1] - (mu / sd) @ w[:-1]
    return raw


def _adam_softmax(x: np.ndarray, y: np.ndarray, num_classes: int, l2: float, steps: int, lr: float) -> np.ndarray:
    n, dim = x.shape
    w = np.zeros((dim, num_classes), dtype=x.dtype)
    onehot = np.eye(num_classes, dtype=x.dtype)[y]
    m, v = np.zeros_like(w), np.zeros_like(w)
    penalty = np.ones((dim, 1), dtype=x.dtype)
    penalty[-1] = 0.0
    for t in range(1, steps + 1):
        grad = x.T @ (softmax(x @ w) - onehot) / n + l2 * penalty * w
        m = 0.9 * m + 0.1 * grad
        v = 0.999 * v + 0.001 * grad ** 2
        w -= lr * (m / (1 - 0.9 ** t)) / (np.sqrt(v / (1 - 0.999 ** t)) + 1e-8)
    return w


def softmax(logits: np.ndarray) -> np.ndarray:
    e = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def log_loss(w: np.ndarray, x: np.ndarray, y: np.ndarray) -> float:
    p = softmax(x @ w)
    return float(-np.mean(np.log(p[np.arange(len(y)), y] + 1e-12)))


def choose_l2(x: np.ndarray, y: np.ndarray, num_classes: int, grid: tuple[float, ...], folds: int,
              seed: int) -> tuple[float, dict[float, float]]:
    """The ``l2`` of ``grid`` with the lowest mean held-out log loss over ``folds`` seeded folds
    of the *training* data (the held-out split is never looked at)."""
    parts = np.array_split(np.random.default_rng(seed).permutation(len(y)), folds)
    scores = {}
    for l2 in grid:
        losses = []
        for k in range(folds):
            train = np.concatenate([parts[j] for j in range(folds) if j != k])
            losses.append(log_loss(fit(x[train], y[train], num_classes, l2), x[parts[k]], y[parts[k]]))
        scores[l2] = float(np.mean(losses))
    return min(scores, key=scores.get), scores
