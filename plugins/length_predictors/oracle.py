"""The true output length (``length_predictor=oracle``): the upper bound of any predictor, for
research. Where the truth comes from (``max_tokens``, or an earlier run's ``requests.jsonl`` for
requests that stop at EOS): :mod:`.true_lengths`.

A request whose truth is unknown (it stops at EOS, and ``lengths_from`` is unset or lacks it)
stops the run when a scheduler first asks about it, naming this plugin and the request: the
predictor cannot see the workload at start-up, and a workload that ignores EOS needs no file.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from servelab.plugin_api import LengthPredictor

from .true_lengths import TrueLengths


@dataclass
class OracleConfig:
    # the requests.jsonl (or run folder) of an earlier run of the same workload: the truth of
    # requests that stop at EOS; null = only requests that ignore EOS can be answered
    lengths_from: Optional[str] = None


class OraclePredictor(LengthPredictor):
    """Predicts the number of tokens the request will generate, exactly."""

    name = "oracle"
    Config = OracleConfig

    def __init__(self, config, context) -> None:
        super().__init__(config, context)
        self.lengths = TrueLengths(config.lengths_from, context.max_model_len)

    def predict(self, request) -> float:
        return float(self.lengths.truth(request))
