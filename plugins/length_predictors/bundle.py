"""The on-disk form of a trained length predictor, and the fingerprint of the model it was trained for.

A bundle is a folder: ``weights.safetensors`` (numpy arrays), ``meta.json`` (the model it was
trained for, the feature definition, the buckets, the data, the held-out metrics) and
``MODEL_CARD.md``. ``experiments/length_predictor/train.py`` writes it; ``length_predictor=learned``
reads it. The shipped one is ``framework/data/length_predictors/tiny_code``.
"""

from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path

import numpy as np

from servelab.plugin_api import PACKAGED_CHECKPOINTS

from .features import FeatureSpec

PACKAGED_PREDICTORS = PACKAGED_CHECKPOINTS.parent / "data" / "length_predictors"
WEIGHTS, META, CARD = "weights.safetensors", "meta.json", "MODEL_CARD.md"
# what identifies a checkpoint: its shape, its tokenizer and its weights (a retrained tiny_code differs)
FINGERPRINT_FILES = ("config.json", "tokenizer.json", "model.safetensors")


def checkpoint_fingerprint(path: str | Path) -> str | None:
    """A short sha256 of the checkpoint folder's config, tokenizer and weights; None when ``path``
    is not a folder holding a ``config.json`` (a catalogue shape, the random tiny model)."""
    folder = Path(path)
    if not (folder / "config.json").is_file():
        return None
    stamps = tuple((name, (folder / name).stat().st_size, (folder / name).stat().st_mtime_ns)
                   for name in FINGERPRINT_FILES if (folder / name).is_file())
    return _fingerprint(str(folder.resolve()), stamps)


@functools.lru_cache(maxsize=8)  # the conformance kit and sweeps build many stacks: hash each checkpoint once
def _fingerprint(folder: str, stamps: tuple) -> str:
    digest = hashlib.sha256()
    for name, _, _ in stamps:
        digest.update(name.encode() + b"\0" + (Path(folder) / name).read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def bundle_folder(path: str | Path | None) -> Path:
    """The bundle folder ``path`` names (the folder or its ``meta.json``); None = the shipped one."""
    if path is None:
        return PACKAGED_PREDICTORS / "tiny_code"
    path = Path(path).expanduser()
    return path.parent if path.name == META else path


def load_bundle(folder: Path) -> tuple[dict, dict[str, np.ndarray]]:
    """(meta, arrays) of a bundle; ValueError naming the file when one is missing or unreadable."""
    from safetensors.numpy import load_file  # noqa: PLC0415 - only learned predictors need it

    meta_path = folder / META
    try:
        meta = json.loads(meta_path.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"length_predictor.path: cannot read {meta_path} ({type(exc).__name__}: {exc})") from None
    try:
        arrays = load_file(str(folder / WEIGHTS))
    except Exception as exc:  # noqa: BLE001 - any unreadable weights file is the same bad input
        raise ValueError(f"length_predictor.path: cannot read {folder / WEIGHTS} "
                         f"({type(exc).__name__}: {exc})") from None
    try:
        num_buckets = len(meta["buckets"]["edges"])
        expected = {"weights": (FeatureSpec.from_json(meta["features"]).dim, num_buckets),
                    "bucket_means": (num_buckets - 1,)}
        if not (meta["model"]["name"] and meta["model"]["fingerprint"]):
            raise ValueError("model")
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"length_predictor.path: {meta_path} is not a predictor's meta.json "
                         f"(missing or bad {exc})") from None
    shapes = {name: tuple(arrays[name].shape) if name in arrays else None for name in expected}
    if shapes != expected:
        raise ValueError(f"length_predictor.path: {folder / WEIGHTS} holds {shapes}, {META} describes {expected}")
    return meta, arrays


def save_bundle(folder: Path, meta: dict, arrays: dict[str, np.ndarray], card: str) -> None:
    from safetensors.numpy import save_file  # noqa: PLC0415

    folder.mkdir(parents=True, exist_ok=True)
    save_file({k: np.ascontiguousarray(v) for k, v in arrays.items()}, str(folder / WEIGHTS))
    (folder / WEIGHTS).chmod(0o644)  # safetensors writes 0600; the package data is world-readable
    (folder / META).write_text(json.dumps(meta, indent=2) + "\n")
    (folder / CARD).write_text(card)
