"""The cached generation lengths (``train_lengths.jsonl``, ``heldout_lengths.jsonl``, and
``lengths_meta.json`` saying how they were made): generated once, reused while the settings and
the model's fingerprint match, so retraining never regenerates."""

from __future__ import annotations

import json
import platform
import time
from pathlib import Path

from servelab.core.packaged import PACKAGED_CHECKPOINTS
from servelab.plugins.length_predictors.bundle import checkpoint_fingerprint
from servelab.config import CorpusWorkload

HERE = Path(__file__).resolve().parent
MODEL = "tiny_code"
PREFIX_BYTES = CorpusWorkload.prefix_bytes  # the corpus workload's defaults: its prompts, its cap
MAX_TOKENS = CorpusWorkload.max_tokens


def lengths_settings(num_train: int, seed: int) -> dict:
    return {"model": MODEL, "model_fingerprint": checkpoint_fingerprint(PACKAGED_CHECKPOINTS / MODEL),
            "decoding": "greedy", "prefix_bytes": PREFIX_BYTES, "max_tokens": MAX_TOKENS,
            "num_train": num_train, "seed": seed}


def load_or_generate(num_train: int, seed: int, folder: Path = HERE, regenerate: bool = False,
                     log=print) -> tuple[list[dict], list[dict], dict]:
    """(train records, held-out records, lengths meta), from the cache when it matches; each
    split is written as soon as it is generated (a failure later keeps it)."""
    settings = lengths_settings(num_train, seed)
    meta_path = folder / "lengths_meta.json"
    meta = json.loads(meta_path.read_text()) if meta_path.is_file() and not regenerate else {}
    if meta.get("settings") != settings:
        if meta:
            log(f"{meta_path}: made with other settings or another model; regenerating")
        meta = {"settings": settings, "python": platform.python_version(), "machine": platform.machine(),
                "splits": {}}
    records = {}
    for split in ("train", "heldout"):
        path = folder / f"{split}_lengths.jsonl"
        if split in meta["splits"] and path.is_file():
            log(f"reusing {path} (--regenerate to make it again)")
            records[split] = read_jsonl(path)
            continue
        from lp_generate import generate, select_prompts  # servelab.api (torch) only when generating

        start = time.perf_counter()
        prompts = select_prompts(num_train, seed, settings["prefix_bytes"])[split]
        records[split] = generate(prompts, split, settings["max_tokens"], log=log)
        write_jsonl(path, records[split])
        meta["splits"][split] = {"prompts": len(records[split]), "wall_s": round(time.perf_counter() - start, 1)}
        meta["generation_wall_s"] = round(sum(s["wall_s"] for s in meta["splits"].values()), 1)
        meta_path.write_text(json.dumps(meta, indent=2) + "\n")
    return records["train"], records["heldout"], meta


def write_jsonl(path: Path, records: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
