"""A predictor trained offline on a model's own generations (``length_predictor=learned``).

A softmax classifier over log-spaced output-length buckets, from prompt features
(:mod:`.features`); the prediction is the expected length under its bucket distribution, each
bucket at the mean length of its training examples, and the top bucket ("did not stop within
the training cap") at the request's own cap: ``min(max_tokens, max_model_len - prompt_len)``.
Every prediction is at most that cap.

The weights are a bundle (:mod:`.bundle`): ``length_predictor.path`` (null = the shipped one,
trained for ``model=tiny_code`` by ``experiments/length_predictor/train.py``; its model card
states its held-out Kendall tau and bucket accuracy). A bundle predicts for the model it was
trained for only: another model (another checkpoint, a retrained ``tiny_code``, the random
``model=tiny``, a catalogue shape in the simulator) is refused at start-up, by fingerprint.

It was trained on greedy generations: for sampled requests (``temperature > 0``) the model
stops elsewhere, and one warning says so.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Optional

import numpy as np

from servelab.plugin_api import LengthPredictor

from .bundle import META, bundle_folder, checkpoint_fingerprint, load_bundle
from .features import FeatureSpec, prompt_features

log = logging.getLogger(__name__)


@dataclass
class LearnedConfig:
    path: Optional[str] = None  # a bundle folder (or its meta.json); null = the shipped tiny_code predictor


class LearnedPredictor(LengthPredictor):
    """Expected output length under a bucket classifier over prompt features."""

    name = "learned"
    Config = LearnedConfig

    def __init__(self, config, context) -> None:
        super().__init__(config, context)
        folder = bundle_folder(config.path)
        meta, arrays = load_bundle(folder)
        trained_for = meta["model"]
        serving = checkpoint_fingerprint(context.model_path) if context.model_path else None
        if serving != trained_for["fingerprint"]:
            this = (f"model={context.model_name}" + (f" ({context.model_path}, fingerprint {serving})"
                                                    if context.model_path else ""))
            raise ValueError(f"{folder / META} was trained for model={trained_for['name']} (fingerprint "
                             f"{trained_for['fingerprint']}), this run serves {this}; length_predictor=oracle "
                             "or noisy_oracle work with any model")
        self.spec = FeatureSpec.from_json(meta["features"])
        self.weights = arrays["weights"].astype(np.float64)  # [feature dim, buckets]
        self.bucket_means = arrays["bucket_means"].astype(np.float64)  # [buckets - 1]: the top one is the cap
        self.decoding_temperature = float(meta.get("data", {}).get("temperature", 0.0))
        self._warned = False

    def bucket_probs(self, request) -> np.ndarray:
        """The classifier's distribution over the output-length buckets of ``request``."""
        logits = prompt_features(np.asarray(request.prompt_token_ids, dtype=np.int64), self.spec) @ self.weights
        p = np.exp(logits - logits.max())
        return p / p.sum()

    def predict(self, request) -> float:
        if request.sampling.temperature != self.decoding_temperature and not self._warned:
            self._warned = True
            log.warning("length_predictor=learned was trained on generations at temperature %g; request %r "
                        "samples at %g, where the model stops elsewhere (predictions are less accurate)",
                        self.decoding_temperature, request.id, request.sampling.temperature)
        cap = max(0, min(request.max_tokens, self.context.max_model_len - request.prompt_len))
        if not request.prompt_token_ids:
            return float(cap)
        p = self.bucket_probs(request)
        return float(p[:-1] @ np.minimum(self.bucket_means, cap) + p[-1] * cap)
