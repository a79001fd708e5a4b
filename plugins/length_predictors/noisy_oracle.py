"""The true output length times log-normal noise (``length_predictor=noisy_oracle``): a predictor
of known quality, to measure how a length-aware scheduler degrades as predictions get worse.

``prediction = truth * exp(sigma * z)``, ``z ~ N(0, 1)``: the median error is 0, a typical one
a factor of ``exp(sigma)`` either way (``sigma=0.5``: x/÷ 1.65; ``sigma=0``: the oracle). It is
not capped at ``max_tokens``: a cap would turn the upper tail into ties. ``z`` is drawn from a
hash of (``seed``, request id), so a request's prediction does not depend on when or how often
it is asked, nor on the other requests, and a run with the same ``seed`` gets the same noise.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from statistics import NormalDist
from typing import Optional

from servelab.plugin_api import LengthPredictor

from .true_lengths import TrueLengths

_NORMAL = NormalDist()


@dataclass
class NoisyOracleConfig:
    sigma: float = 0.5  # standard deviation of the log-error (0 = the oracle)
    lengths_from: Optional[str] = None  # as length_predictor=oracle's


def standard_normal(seed: int, request_id: str) -> float:
    """A N(0, 1) draw that is a pure function of (``seed``, ``request_id``)."""
    digest = hashlib.blake2b(f"{seed}\0{request_id}".encode(), digest_size=8).digest()
    return _NORMAL.inv_cdf((int.from_bytes(digest, "big") + 0.5) / 2**64)


class NoisyOraclePredictor(LengthPredictor):
    """The truth, multiplied by a seeded log-normal error per request."""

    name = "noisy_oracle"
    Config = NoisyOracleConfig

    def __init__(self, config, context) -> None:
        super().__init__(config, context)
        if not (math.isfinite(config.sigma) and config.sigma >= 0):
            raise ValueError(f"length_predictor.sigma={config.sigma} must be a finite number >= 0 (0 = the oracle)")
        self.lengths = TrueLengths(config.lengths_from, context.max_model_len)

    def predict(self, request) -> float:
        truth = self.lengths.truth(request)
        if self.config.sigma == 0:
            return float(truth)
        return truth * math.exp(self.config.sigma * standard_normal(self.context.seed, request.id))
