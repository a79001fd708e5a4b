"""Text workloads: a file of prompts, or prompts drawn from the held-out split of the stdlib corpus.

Both tokenize with the checkpoint's own tokenizer (``servelab.workloads.text.CheckpointText``); a
checkpoint without one is an error naming it.
"""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from servelab.core.errors import WorkloadError
from servelab.core.request import Request, SamplingParams
from servelab.workloads import corpus
from servelab.workloads.clients import (client_ids, draw_clients, parse_clients, rates_unless_all_at_once,
                                        summed_rate)

_ESCAPES = {"n": "\n", "t": "\t", "\\": "\\"}
# the way out for a checkpoint without a tokenizer (the user's own, most often): token ids
NO_TOKENIZER_HINT = "run token ids instead: workload=synthetic, or workload=jsonl with prompt_token_ids"


def unescape(line: str) -> str:
    """``\\n`` -> newline, ``\\t`` -> tab, ``\\\\`` -> backslash; any other backslash stays as written."""
    return re.sub(r"\\(.)", lambda m: _ESCAPES.get(m.group(1), m.group(0)), line)


def _arrivals(cfg, n: int, rng: np.random.Generator, rate: float | None = None) -> np.ndarray:
    """Poisson arrivals at ``rate`` (default ``workload.rate``; the clients' summed rate when they
    give rates: the same draws, rescaled), or all at once."""
    if getattr(cfg.arrival, "value", cfg.arrival) == "poisson" and n:
        rate = rate or cfg.rate
        if rate <= 0:
            raise WorkloadError(f"workload.rate={cfg.rate} must be > 0 for Poisson arrivals")
        arrivals = np.cumsum(rng.exponential(1.0 / rate, size=n))
        return arrivals - arrivals[0]
    return np.zeros(n)


def _requests(cfg, prompts: list[tuple[str, tuple[int, ...]]], rng: np.random.Generator) -> list[Request]:
    if cfg.max_tokens < 1:
        raise WorkloadError(f"workload.max_tokens={cfg.max_tokens} must be >= 1")
    clients = parse_clients(cfg, rates_unless_all_at_once(cfg))
    arrivals = _arrivals(cfg, len(prompts), rng, summed_rate(clients))
    ids = client_ids(clients, draw_clients(clients, len(prompts), cfg.seed), len(prompts))
    sampling = SamplingParams(cfg.temperature, cfg.top_p, cfg.top_k, None)
    return [Request(id=rid, prompt_token_ids=tokens, max_tokens=cfg.max_tokens, arrival_time=float(arrivals[i]),
                    sampling=sampling, ignore_eos=cfg.ignore_eos, client_id=ids[i])
            for i, (rid, tokens) in enumerate(prompts)]


def prompts_requests(cfg, text) -> list[Request]:
    """One request per non-blank line of ``workload.path``."""
    path = Path(cfg.path)
    if not path.is_file():
        raise WorkloadError(f"workload.path={str(path)!r}: no such file")
    text.require("workload=prompts", hint=NO_TOKENIZER_HINT)
    prompts = []
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.strip():
            prompts.append((f"prompt-{lineno}", text.encode(unescape(line), f"{path}:{lineno}")))
    if not prompts:
        raise WorkloadError(f"workload.path={str(path)!r}: no prompts (every line is blank)")
    return _requests(cfg, prompts, np.random.default_rng(cfg.seed))


def corpus_requests(cfg, text) -> list[Request]:
    """``num_requests`` prompts: the first ``prefix_bytes`` bytes of held-out documents (seeded draw)."""
    if cfg.num_requests < 0:
        raise WorkloadError(f"workload.num_requests={cfg.num_requests} must be >= 0")
    if cfg.prefix_bytes < 1:
        raise WorkloadError(f"workload.prefix_bytes={cfg.prefix_bytes} must be >= 1")
    text.require("workload=corpus", hint=NO_TOKENIZER_HINT)
    try:
        docs = [d.encode("utf-8") for d in corpus.heldout_documents()]
    except corpus.CorpusError as exc:
        raise WorkloadError(f"workload=corpus: {exc}") from None
    longer = [d for d in docs if len(d) > cfg.prefix_bytes]
    if not longer:
        raise WorkloadError(f"workload.prefix_bytes={cfg.prefix_bytes}: no held-out document is longer than that")
    rng = np.random.default_rng(cfg.seed)
    picks = rng.choice(len(longer), size=cfg.num_requests, replace=cfg.num_requests > len(longer))
    prompts = [(f"corpus-{i}", text.encode(longer[j][:cfg.prefix_bytes].decode("utf-8", errors="ignore"),
                                           "workload=corpus"))
               for i, j in enumerate(picks)]
    return _requests(cfg, prompts, rng)
