"""Train ``length_predictor=learned`` for the shipped ``tiny_code`` model.

    python experiments/length_predictor/train.py     # -> framework/data/length_predictors/tiny_code

1. **Data** (:mod:`lp_cache`, :mod:`lp_generate`): ``tiny_code``'s greedy generations of corpus
   prompts on servelab's own engine, on the CPU: ``--num-train`` prompts of the training split,
   every held-out prompt. Cached in ``train_lengths.jsonl`` / ``heldout_lengths.jsonl`` beside
   this script and reused while the settings and the model's fingerprint match (``--regenerate``).
2. **Train** (:mod:`lp_fit`): a softmax classifier over 8 log-spaced output-length buckets from the
   prompt features of ``servelab.plugins.length_predictors.features``; its L2 strength by 5-fold
   cross-validated log loss on the training split.
3. **Evaluate** (:mod:`lp_metrics`) on the held-out split, through the plugin itself
   (``LearnedPredictor.predict`` on each prompt): Kendall's tau-b, bucket accuracy, ROC AUC of
   "stops before max_tokens", MAE. The same for three baselines (the same classifier on the
   prompt length alone, on the last prompt token alone, and a constant), and for all four
   out-of-fold on the training split (more prompts that stop early than the held-out split has).
4. **Write** the bundle: ``weights.safetensors``, ``meta.json`` (model + fingerprint, features,
   buckets, data, metrics), ``MODEL_CARD.md``.

Everything random comes from ``--seed``; the same command on the same machine gives the same
bundle (the generations are greedy; the fit is full-batch from zeros).
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from lp_cache import MODEL, load_or_generate, read_jsonl  # noqa: F401 - read_jsonl: for tests
from lp_card import model_card  # the folder's own modules
from lp_fit import choose_l2, fit, softmax
from lp_metrics import kendall_tau_b, metrics

from servelab.core.interfaces import PredictorContext
from servelab.core.packaged import PACKAGED_CHECKPOINTS
from servelab.core.request import Request, SamplingParams
from servelab.plugins.length_predictors.bundle import (PACKAGED_PREDICTORS, checkpoint_fingerprint,
                                                       save_bundle)
from servelab.plugins.length_predictors.features import FeatureSpec, bucket_of, feature_matrix
from servelab.plugins.length_predictors.learned import LearnedConfig, LearnedPredictor

L2_GRID = (0.03, 0.1, 0.3, 1.0, 3.0)  # on standardised features (lp_fit)
FOLDS = 5
SHAPE = json.loads((PACKAGED_CHECKPOINTS / MODEL / "config.json").read_text())
SPEC = FeatureSpec(vocab_size=SHAPE["vocab_size"])
_ONE = FeatureSpec(vocab_size=SHAPE["vocab_size"], tail=1)  # the baselines' columns of it:
BASELINE_COLUMNS = {"prompt_length": [_ONE.dim - 2, _ONE.dim - 1],  # log length, bias
                    "last_token": [*range(_ONE.vocab_size, 2 * _ONE.vocab_size), _ONE.dim - 1]}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--num-train", type=int, default=3000, help="training prompts to generate (default 3000)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--regenerate", action="store_true", help="generate the lengths again, ignoring the cache")
    p.add_argument("--out", type=Path, default=PACKAGED_PREDICTORS / MODEL, help="bundle folder")
    return p.parse_args(argv)


class Split:
    """One split's prompts (token ids) and what the model did with them."""

    def __init__(self, records: list[dict], edges: np.ndarray) -> None:
        self.records = records
        self.prompts = encoded(records)
        self.lengths = np.array([r["output_len"] for r in records])
        self.buckets = bucket_of(self.lengths, edges)
        self.stopped = np.array([r["finish_reason"] == "stop" for r in records])

    def metrics(self, predicted: np.ndarray, predicted_bucket: np.ndarray) -> dict:
        return metrics(predicted, predicted_bucket, self.lengths, self.buckets, self.stopped)


def bucket_edges(max_tokens: int) -> np.ndarray:
    """1, 2, 4, ... up to ``max_tokens``: the last bucket is "ran to the cap"."""
    return 2 ** np.arange(int(np.log2(max_tokens)) + 1)


def bucket_means(lengths: np.ndarray, buckets: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Each bucket below the cap at the mean length of its examples (its geometric middle if empty)."""
    return np.array([lengths[buckets == b].mean() if np.any(buckets == b) else np.sqrt(edges[b] * edges[b + 1])
                     for b in range(len(edges) - 1)])


def expected_length(p: np.ndarray, means: np.ndarray, cap: float) -> np.ndarray:
    """What ``LearnedPredictor.predict`` computes, for rows of bucket probabilities."""
    return p[:, :-1] @ np.minimum(means, cap) + p[:, -1] * cap


def encoded(records: list[dict]) -> list[tuple[int, ...]]:
    from servelab.workloads.text import CheckpointText  # transformers

    text = CheckpointText(PACKAGED_CHECKPOINTS / MODEL)
    return [text.encode(r["prompt"], r["source"]) for r in records]


def evaluate_bundle(folder: Path, records: list[dict], prompts: list[tuple[int, ...]]) -> tuple[dict, np.ndarray]:
    """Held-out metrics of the bundle in ``folder``, through ``LearnedPredictor`` itself."""
    context = PredictorContext(MODEL, str(PACKAGED_CHECKPOINTS / MODEL), SHAPE["vocab_size"],
                               SHAPE["max_position_embeddings"])
    predictor = LearnedPredictor(LearnedConfig(path=str(folder)), context)
    greedy = SamplingParams(0.0, 1.0, 0, None)
    requests = [Request(r["id"], p, r["max_tokens"], 0.0, greedy, ignore_eos=False) for r, p in zip(records, prompts)]
    predicted = np.array([predictor.predict(r) for r in requests])
    buckets = np.array([int(np.argmax(predictor.bucket_probs(r))) for r in requests])
    lengths = np.array([r["output_len"] for r in records])
    stopped = np.array([r["finish_reason"] == "stop" for r in records])
    edges = bucket_edges(records[0]["max_tokens"])
    return metrics(predicted, buckets, lengths, bucket_of(lengths, edges), stopped), predicted


def out_of_fold(x: np.ndarray, split: Split, edges: np.ndarray, l2: float, seed: int) -> dict:
    """Metrics of predictions for each training prompt by a model fitted without its fold."""
    parts = np.array_split(np.random.default_rng(seed).permutation(len(split.lengths)), FOLDS)
    predicted, predicted_bucket = np.zeros(len(split.lengths)), np.zeros(len(split.lengths), dtype=int)
    for k in range(FOLDS):
        test = parts[k]
        train = np.concatenate([parts[j] for j in range(FOLDS) if j != k])
        p = softmax(x[test] @ fit(x[train], split.buckets[train], len(edges), l2))
        predicted[test] = expected_length(p, bucket_means(split.lengths[train], split.buckets[train], edges), edges[-1])
        predicted_bucket[test] = p.argmax(axis=1)
    return split.metrics(predicted, predicted_bucket)


def baselines(train: Split, heldout: Split, edges: np.ndarray, l2: float, seed: int) -> dict:
    """{name: {"heldout": metrics, "cv": metrics}} of the three baselines."""
    means = bucket_means(train.lengths, train.buckets, edges)
    x_train = feature_matrix(train.prompts, _ONE).astype(np.float32)
    x_test = feature_matrix(heldout.prompts, _ONE)
    out = {}
    for name, cols in BASELINE_COLUMNS.items():
        p = softmax(x_test[:, cols] @ fit(x_train[:, cols], train.buckets, len(edges), l2))
        out[name] = {"heldout": heldout.metrics(expected_length(p, means, edges[-1]), p.argmax(axis=1)),
                     "cv": out_of_fold(x_train[:, cols], train, edges, l2, seed)}
    majority = np.bincount(train.buckets, minlength=len(edges)).argmax()
    mean = float(train.lengths.mean())
    out["constant"] = {s: split.metrics(np.full(len(split.lengths), mean), np.full(len(split.lengths), majority))
                       for s, split in (("heldout", heldout), ("cv", train))}
    return out


def train(args: argparse.Namespace, log=print) -> dict:
    train_recs, heldout_recs, lengths_meta = load_or_generate(args.num_train, args.seed, regenerate=args.regenerate,
                                                              log=log)
    start = time.perf_counter()
    settings = lengths_meta["settings"]
    edges = bucket_edges(settings["max_tokens"])
    train_split, heldout_split = Split(train_recs, edges), Split(heldout_recs, edges)
    x = feature_matrix(train_split.prompts, SPEC).astype(np.float32)  # float32: twice as fast, same fit
    l2, cv_loss = choose_l2(x, train_split.buckets, len(edges), L2_GRID, FOLDS, args.seed)
    log(f"l2={l2:g} (5-fold log loss: {', '.join(f'{k:g}: {v:.4f}' for k, v in cv_loss.items())})")
    arrays = {"weights": fit(x, train_split.buckets, len(edges), l2).astype(np.float32),
              "bucket_means": bucket_means(train_split.lengths, train_split.buckets, edges).astype(np.float32)}
    meta = {
        "predictor": "learned", "format": 1,
        "model": {"name": MODEL, "fingerprint": checkpoint_fingerprint(PACKAGED_CHECKPOINTS / MODEL),
                  "fingerprint_of": "sha256 of config.json, tokenizer.json, model.safetensors (first 16 hex)"},
        "features": SPEC.to_json(),
        "buckets": {"edges": edges.tolist(), "means": [round(float(m), 3) for m in arrays["bucket_means"]],
                    "top": f"output_len >= {edges[-1]}: did not stop within the training cap; predicted at the "
                           "request's own cap"},
        "prediction": "expected length under the bucket distribution, each bucket at its training mean, "
                      "capped at min(max_tokens, max_model_len - prompt_len)",
        "training": {"model": "softmax regression (numpy, Adam, full batch, from zeros)", "l2": l2,
                     "cv_log_loss": {f"{k:g}": round(v, 5) for k, v in cv_loss.items()}, "folds": FOLDS,
                     "seed": args.seed},
        "data": {"corpus": "the Python standard library's sources (servelab.workloads.corpus), training split; "
                           "evaluated on the held-out split",
                 "decoding": settings["decoding"], "temperature": 0.0, "prefix_bytes": settings["prefix_bytes"],
                 "max_tokens": settings["max_tokens"], "num_train": len(train_recs),
                 "num_heldout": len(heldout_recs), "train_stopped": int(train_split.stopped.sum()),
                 "heldout_stopped": int(heldout_split.stopped.sum()),
                 "train_bucket_counts": np.bincount(train_split.buckets, minlength=len(edges)).tolist(),
                 # a perfect ranking that must still break the truth's ties (most prompts run to max_tokens)
                 "heldout_tau_b_ceiling": round(kendall_tau_b(heldout_split.lengths + 1e-6 * np.arange(
                     len(heldout_recs)), heldout_split.lengths), 4),
                 "python": lengths_meta["python"], "generation_wall_s": lengths_meta["generation_wall_s"]},
        "command": " ".join(["python experiments/length_predictor/train.py", shlex.join(sys.argv[1:])]).strip(),
    }
    save_bundle(args.out, meta, arrays, "")  # evaluated through the plugin, which reads the bundle
    meta["heldout_metrics"], _ = evaluate_bundle(args.out, heldout_recs, heldout_split.prompts)
    meta["cv_metrics"] = out_of_fold(x, train_split, edges, l2, args.seed)
    meta["baselines"] = baselines(train_split, heldout_split, edges, l2, args.seed)
    meta["training"]["wall_s"] = round(time.perf_counter() - start, 1)
    save_bundle(args.out, meta, arrays, model_card(meta))
    log(f"held-out: {meta['heldout_metrics']}  (cross-validated on the training split: {meta['cv_metrics']})")
    for name, figures in meta["baselines"].items():
        log(f"baseline {name}: held-out {figures['heldout']}  cv {figures['cv']}")
    log(f"wrote {args.out} (training {meta['training']['wall_s']} s; generation {lengths_meta['generation_wall_s']} s)")
    return meta


if __name__ == "__main__":
    train(parse_args())
