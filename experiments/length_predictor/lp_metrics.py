"""Held-out metrics of a length predictor: Kendall's tau-b (what a shortest-first scheduler needs:
the order), bucket accuracy, ROC AUC of "stops before max_tokens", mean absolute error."""

from __future__ import annotations

import numpy as np


def kendall_tau_b(x: np.ndarray, y: np.ndarray) -> float:
    """Kendall's tau-b (ties in either variable corrected, as scipy.stats.kendalltau); NaN when
    one variable is constant. O(n^2) memory: fine for the few hundred held-out prompts."""
    x, y = np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)
    iu = np.triu_indices(len(x), k=1)
    dx = np.sign(x[:, None] - x[None, :])[iu]
    dy = np.sign(y[:, None] - y[None, :])[iu]
    denom = np.sqrt(np.count_nonzero(dx) * np.count_nonzero(dy))
    return float(np.sum(dx * dy) / denom) if denom else float("nan")


def roc_auc(scores: np.ndarray, positive: np.ndarray) -> float:
    """P(score of a random positive > score of a random negative), ties counting half; NaN
    without both classes."""
    pos, neg = scores[positive], scores[~positive]
    if not len(pos) or not len(neg):
        return float("nan")
    diff = pos[:, None] - neg[None, :]
    return float((np.sum(diff > 0) + 0.5 * np.sum(diff == 0)) / diff.size)


def metrics(predicted: np.ndarray, predicted_bucket: np.ndarray, true_len: np.ndarray, true_bucket: np.ndarray,
            stopped: np.ndarray) -> dict:
    """The figures the model card states (``stopped``: the request ended at EOS); None where
    undefined (a constant prediction has no tau)."""
    return {"kendall_tau_b": _rounded(kendall_tau_b(predicted, true_len), 4),
            "bucket_accuracy": _rounded(float(np.mean(predicted_bucket == true_bucket)), 4),
            # a shorter prediction should mean "stops early": score = -prediction
            "stop_auc": _rounded(roc_auc(-predicted, stopped), 4),
            "mae_tokens": _rounded(float(np.mean(np.abs(predicted - true_len))), 2)}


def _rounded(value: float, digits: int) -> float | None:
    return None if value != value else round(value, digits)  # NaN -> null: meta.json stays strict JSON
