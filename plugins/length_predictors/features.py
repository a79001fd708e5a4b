"""Prompt features of ``length_predictor=learned``, and its output-length buckets.

One definition for training (``experiments/length_predictor``) and prediction, so the two can
never disagree. Everything is a function of the prompt's token ids alone (what a server sees on
arrival), computed with numpy in a few microseconds per request:

- ``hist``: the token-id histogram of the whole prompt (``vocab_size`` bins, sums to 1);
- ``tail``: the token-id histogram of its last ``tail`` tokens (where generation picks up);
- ``bigrams``: hashed bigrams of the last ``tail`` tokens (``hash_bins`` bins, sums to 1);
- ``len``: ``log1p(prompt_len) / 8`` and a constant 1 (the bias).

Ids at or above ``vocab_size`` wrap around (``id % vocab_size``): a prompt of another tokenizer
still yields a vector, but not a meaningful one (the model refuses other models at start-up).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

_BIGRAM_MULT = 1_000_003  # a prime: (a * p + b) % bins spreads id pairs over the bins


@dataclass(frozen=True)
class FeatureSpec:
    vocab_size: int
    tail: int = 16
    hash_bins: int = 256

    @property
    def dim(self) -> int:
        return 2 * self.vocab_size + self.hash_bins + 2

    def to_json(self) -> dict:
        return {"kind": "hist+tail_hist+tail_bigrams+log_len", **asdict(self)}

    @classmethod
    def from_json(cls, obj: dict) -> "FeatureSpec":
        return cls(int(obj["vocab_size"]), int(obj["tail"]), int(obj["hash_bins"]))


def prompt_features(ids: np.ndarray, spec: FeatureSpec) -> np.ndarray:
    """The feature vector (float64, ``spec.dim``) of one prompt's token ids (int64, length >= 1)."""
    v, h = spec.vocab_size, spec.hash_bins
    ids = ids % v
    tail = ids[-spec.tail:]
    x = np.zeros(spec.dim)
    x[:v] = np.bincount(ids, minlength=v) / len(ids)
    x[v:2 * v] = np.bincount(tail, minlength=v) / len(tail)
    if len(tail) > 1:
        pairs = (tail[:-1] * _BIGRAM_MULT + tail[1:]) % h
        x[2 * v:2 * v + h] = np.bincount(pairs, minlength=h) / (len(tail) - 1)
    x[-2] = np.log1p(len(ids)) / 8.0
    x[-1] = 1.0
    return x


def feature_matrix(prompts: list[tuple[int, ...]], spec: FeatureSpec) -> np.ndarray:
    """``prompt_features`` of each prompt, one row each (training and evaluation)."""
    return np.stack([prompt_features(np.asarray(p, dtype=np.int64), spec) for p in prompts])


def bucket_of(lengths: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Bucket index of each output length: bucket ``i`` holds ``edges[i] <= length < edges[i+1]``,
    the last bucket everything from ``edges[-1]`` up."""
    return np.searchsorted(edges, lengths, side="right") - 1
