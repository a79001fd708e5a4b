"""Which experts a simulated step's tokens are routed to (``sim.moe``): the tokens per expert of every
MoE layer, drawn per token or replayed from a routing trace, from which the time models price the
experts a step actually touches (:mod:`servelab.sim.moe_pricer`).

- Drawn (``sim.moe.routing_skew``): expert popularity follows a Zipf law of exponent ``skew``
  (``p_j ~ 1 / (j + 1) ** skew``; 0 = uniform), the ranking shuffled per layer (a layer's hot experts
  are its own). Each token picks ``experts_per_token`` distinct experts, drawn without replacement in
  proportion to ``p`` (Gumbel top-k: a token's top-k of ``log p + Gumbel noise``). Steps of more than
  :data:`EXACT_TOKENS` tokens draw the counts as one multinomial over the per-token inclusion
  probabilities (estimated once from exact draws): at that size the distinct-per-token constraint no
  longer changes which experts are touched, and a prefill step stays cheap to simulate.
- Replayed (``sim.moe.routing_trace``): an integer array (``.npy``, or ``.json`` nested lists) of each
  token's expert ids, ``[tokens, experts_per_token]`` (every MoE layer routes a token alike) or
  ``[tokens, moe_layers, experts_per_token]``; consecutive steps take consecutive tokens, wrapping
  around at the end.

Deterministic: one ``numpy`` generator seeded by ``sim.moe.seed``; the same steps draw the same routing.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from servelab.core.errors import ConfigError

EXACT_TOKENS = 64  # steps up to this many tokens draw each token's top-k exactly
_INCLUSION_SAMPLES = 8192  # exact draws that estimate the per-token inclusion probabilities


def zipf_popularity(num_experts: int, skew: float) -> np.ndarray:
    """``p_j ~ 1 / (j + 1) ** skew`` over the experts (0: uniform), summing to 1."""
    p = 1.0 / np.arange(1, num_experts + 1, dtype=float) ** skew
    return p / p.sum()


class ExpertRouting:
    """Tokens per expert of each MoE layer for a step of ``n`` tokens: :meth:`counts`."""

    def __init__(self, num_experts: int, experts_per_token: int, num_moe_layers: int, skew: float = 0.0,
                 seed: int = 0, trace: str | None = None) -> None:
        if skew < 0:
            raise ConfigError(f"sim.moe.routing_skew={skew} must be >= 0 (0 = uniform routing)")
        self.num_experts, self.top_k, self.num_layers = num_experts, experts_per_token, num_moe_layers
        self.skew, self.seed, self.trace_path = skew, seed, trace
        self._rng = np.random.default_rng(seed)
        base = zipf_popularity(num_experts, skew)
        order = np.random.default_rng([seed, 1]).permuted(np.tile(np.arange(num_experts), (num_moe_layers, 1)), axis=1)
        self._base = base
        self._rank = np.argsort(order, axis=1)  # [layer, expert]: its popularity rank (expert order[l, j] has rank j)
        self._log_p32 = np.log(base)[self._rank].astype(np.float32)
        self._trace = _load_trace(trace, num_experts, experts_per_token, num_moe_layers) if trace else None
        self._cursor = 0
        self._inclusion: np.ndarray | None = None

    def describe(self) -> str:
        if self._trace is not None:
            return f"replayed from {self.trace_path} ({len(self._trace):,} tokens)"
        return "uniform" if self.skew == 0 else f"Zipf skew {self.skew:g}"

    def counts(self, n: int, rng: np.random.Generator | None = None) -> np.ndarray:
        """``[moe_layers, num_experts]`` tokens routed to each expert for a step of ``n`` tokens (each
        token counts once at each of its ``experts_per_token`` experts). ``rng``: draw from another
        generator (the step's own draws stay as they were)."""
        if self._trace is not None:
            return self._replay(n)
        rng = rng or self._rng
        if n <= EXACT_TOKENS:
            return self._exact(n, rng)
        if self._inclusion is None:  # every layer's popularity is the same law re-ranked: estimate it once
            scores = np.log(self._base) + np.random.default_rng([self.seed, 2]).gumbel(
                size=(_INCLUSION_SAMPLES, self.num_experts))
            top = np.argpartition(-scores, self.top_k - 1, axis=1)[:, :self.top_k]
            share = np.bincount(top.ravel(), minlength=self.num_experts) / (_INCLUSION_SAMPLES * self.top_k)
            self._inclusion = share[self._rank]
        return rng.multinomial(n * self.top_k, self._inclusion)

    def _exact(self, n: int, rng: np.random.Generator) -> np.ndarray:
        # Gumbel noise as -log(-log(U)) in float32: three times faster than float64 gumbel(), and the
        # top-k of a few hundred values does not need the precision
        scores = self._log_p32[:, None, :] - np.log(-np.log(rng.random((self.num_layers, n, self.num_experts),
                                                                       dtype=np.float32)))
        top = np.argpartition(-scores, self.top_k - 1, axis=2)[:, :, :self.top_k]
        return self._bincount(top)

    def _bincount(self, ids: np.ndarray) -> np.ndarray:
        """``ids``: ``[layers, tokens, k]`` expert ids -> ``[layers, experts]`` counts."""
        flat = (ids + np.arange(self.num_layers)[:, None, None] * self.num_experts).ravel()
        return np.bincount(flat, minlength=self.num_layers * self.num_experts).reshape(self.num_layers, self.num_experts)

    def _replay(self, n: int) -> np.ndarray:
        assert self._trace is not None
        idx = (self._cursor + np.arange(n)) % len(self._trace)
        self._cursor = (self._cursor + n) % len(self._trace)
        return self._bincount(np.moveaxis(self._trace[idx], 0, 1))  # [tokens, layers, k] -> [layers, tokens, k]


def _load_trace(path: str, num_experts: int, top_k: int, num_layers: int) -> np.ndarray:
    """``[tokens, moe_layers, k]`` expert ids from ``path``; one line naming the key on bad input."""
    where = f"sim.moe.routing_trace={path!r}"
    try:
        arr = np.load(path) if str(path).endswith(".npy") else np.asarray(json.loads(Path(path).read_text()))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{where}: cannot read a routing trace there ({type(exc).__name__}: {exc})") from None
    if arr.ndim == 2:
        arr = np.repeat(arr[:, None, :], num_layers, axis=1)
    if arr.ndim != 3 or arr.shape[1:] != (num_layers, top_k) or not len(arr) or not np.issubdtype(arr.dtype, np.integer):
        raise ConfigError(f"{where}: expected integer expert ids of shape [tokens, {top_k}] or "
                          f"[tokens, {num_layers}, {top_k}] (the model's MoE layers, experts_per_token), "
                          f"got shape {list(arr.shape)} of {arr.dtype}")
    if arr.min() < 0 or arr.max() >= num_experts:
        raise ConfigError(f"{where}: expert ids must lie in [0, {num_experts}) (the model has {num_experts} experts); "
                          f"found {int(arr.min())}..{int(arr.max())}")
    return arr.astype(np.int64)
