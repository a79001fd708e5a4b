"""The data of ``length_predictor=learned``: how many tokens the shipped ``tiny_code`` model
generates, greedily, for corpus prompts (the prompts ``workload=corpus`` makes: the first
``prefix_bytes`` bytes of a document), on servelab's own engine on the CPU.

- training prompts: ``num_train`` distinct prefixes drawn (seeded) from the corpus's *training*
  split; held-out prompts: every distinct prefix of the *held-out* split (the ones
  ``workload=corpus`` draws from) that is not also a training prefix;
- each request: greedy, stops at EOS or ``max_tokens`` (the corpus workload's defaults);
- one jsonl line per prompt: ``id``, ``split``, ``source`` (file and document), ``prompt`` (the
  exact text that was tokenized), ``prompt_len``, ``max_tokens``, ``output_len``, ``finish_reason``.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from lp_cache import MAX_TOKENS, PREFIX_BYTES
from servelab.api import LLM
from servelab.core.request import Request, SamplingParams
from servelab.workloads import corpus


def corpus_prefixes(files: list[Path], root: Path, prefix_bytes: int) -> dict[str, str]:
    """Distinct prompt text -> its first source (``path#document``), in corpus order: the text
    ``workload=corpus`` encodes for a document longer than ``prefix_bytes``."""
    out: dict[str, str] = {}
    for path in files:
        docs = corpus.split_documents(path.read_bytes().decode("utf-8", errors="replace"))
        for i, doc in enumerate(docs):
            raw = doc.encode("utf-8")
            if len(raw) > prefix_bytes:
                out.setdefault(raw[:prefix_bytes].decode("utf-8", errors="ignore"),
                               f"{path.relative_to(root).as_posix()}#{i}")
    return out


def select_prompts(num_train: int, seed: int, prefix_bytes: int = PREFIX_BYTES) -> dict[str, list[tuple[str, str]]]:
    """``{"train": [(prompt, source), ...], "heldout": [...]}`` (see the module docstring)."""
    root = corpus.stdlib_root()
    train_files, heldout_files = corpus.split_files(root)
    train = corpus_prefixes(train_files, root, prefix_bytes)
    heldout = {p: s for p, s in corpus_prefixes(heldout_files, root, prefix_bytes).items() if p not in train}
    items = list(train.items())
    picks = np.random.default_rng(seed).permutation(len(items))[:num_train]
    return {"train": [items[i] for i in sorted(picks)], "heldout": list(heldout.items())}


def generate(prompts: list[tuple[str, str]], split: str, max_tokens: int = MAX_TOKENS,
             max_num_seqs: int = 128, log=print) -> list[dict]:
    """Run every prompt through ``model=tiny_code`` (greedy, all at once) and return the records."""
    lab = LLM(["model=tiny_code", f"max_num_seqs={max_num_seqs}"], logger="none", progress=False)
    greedy = SamplingParams(0.0, 1.0, 0, None)
    requests, meta = [], {}
    for i, (text, source) in enumerate(prompts):
        rid = f"{split}-{i}"
        requests.append(Request(rid, lab.text.encode(text, source), max_tokens, 0.0, greedy, ignore_eos=False))
        meta[rid] = (text, source)
    start = time.perf_counter()
    result = lab.generate(requests)
    log(f"{split}: {len(requests)} prompts generated in {time.perf_counter() - start:.0f} s")
    records = []
    for rec in result.requests:
        text, source = meta[rec["id"]]
        records.append({"id": rec["id"], "split": split, "source": source, "prompt": text,
                        "prompt_len": rec["prompt_len"], "max_tokens": rec["max_tokens"],
                        "output_len": rec["output_len"], "finish_reason": rec["finish_reason"]})
    return sorted(records, key=lambda r: int(r["id"].rsplit("-", 1)[1]))
