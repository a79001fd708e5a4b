"""Which experts a simulated step's tokens are routed to (``sim.moe``): the tokens per expert of every
MoE layer, drawn per token or replayed from a routing trace, from which the time models price the
experts a step actually touches (:mod:`servelab.sim.moe_pricer`).

- Drawn (``sim.moe.routing_skew``): expert popularity follows a Zipf law of exponent ``skew``
  (``p_j ~ 1 / (j + 1) ** skew``; 0 = uniform), the ranking shuffled per layer (a layer's hot experts
  are its own). Each token picks ``experts_per_token`` distinct experts, drawn without replacement in
  proportion to ``p`` (Gumbel top-k: a token's top-k of ``log p + Gumbel noise``). Those draws are made
  once, :data:`POOL_TOKENS` per layer; a step's tokens each take one of them at random per layer (a
  step costs indices, not a draw over every expert). Steps of more than :data:`EXACT_TOKENS` tokens draw
  the counts as one multinomial over the pool's per-expert share: at that size the distinct-per-token
  constraint no longer changes which experts are touched, and a prefill step stays cheap to simulate.
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

EXACT_TOKENS = 256  # steps up to this many tokens draw each token's experts from the pool of exact draws
POOL_TOKENS = 4096  # exact per-token draws per layer, made once


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
        self._rank = np.argsort(order, axis=1)  # [layer, expert]: its popularity rank (expert order[l, j] has rank j)
        self._p = base[self._rank]
        self._trace = _load_trace(trace, num_experts, experts_per_token, num_moe_layers) if trace else None
        self._cursor = 0
        self._pool: np.ndarray | None = None
        self._inclusion = np.empty(0)

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
        if self._pool is None:
            self._pool = self._draw_pool()
        if n > EXACT_TOKENS:
            return rng.multinomial(n * self.top_k, self._inclusion)
        rows = rng.integers(0, POOL_TOKENS, size=(self.num_layers, n))
        return self._bincount(self._pool[np.arange(self.num_layers)[:, None], rows])

    def _draw_pool(self) -> np.ndarray:
        """``[layers, POOL_TOKENS, k]``: exact per-token draws (Gumbel top-k), once; a step's tokens
        are drawn from it, and the inclusion law of the multinomial path is its share per expert."""
        rng = np.random.default_rng([self.seed, 2])
        pool = np.empty((self.num_layers, POOL_TOKENS, self.top_k), dtype=np.int64)
        for layer in range(self.num_layers):
            u = rng.random((POOL_TOKENS, self.num_experts)) * (1 - 2e-16) + 1e-16  # (0, 1): no log(0)
            scores = np.log(self._p[layer]) - np.log(-np.log(u))
            pool[layer] = np.argpartition(-scores, self.top_k - 1, axis=1)[:, :self.top_k]
        self._inclusion = self._bincount(pool) / (POOL_TOKENS * self.top_k)
        return pool

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
