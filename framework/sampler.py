"""Next-token selection: greedy argmax, or temperature / top-k / top-p sampling with per-token seeds."""

from __future__ import annotations

import torch

from .request import SamplingParams


def sample(logits: torch.Tensor, params: list[SamplingParams | None], seeds: list[int]) -> list[int]:
    """Pick one token per row of ``logits [S, vocab]``; rows with ``None`` params are greedy.

    A sampled row uses its own generator seeded by ``seeds[row]``, so the result of a request does
    not depend on what else was in the batch.
    """
    tokens = logits.argmax(dim=-1).tolist()
    for row, p in enumerate(params):
        if p is not None:
            tokens[row] = _sample_row(logits[row], p, seeds[row])
    return tokens


def _sample_row(logits: torch.Tensor, p: SamplingParams, seed: int) -> int:
    logits = logits.float() / max(p.temperature, 1e-5)
    if 0 < p.top_k < logits.shape[-1]:
        kth = torch.topk(logits, p.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = logits.softmax(-1)
    if p.top_p < 1.0:
        sorted_probs, order = probs.sort(descending=True)
        keep = sorted_probs.cumsum(-1) - sorted_probs < p.top_p  # always keeps the top token
        probs = torch.zeros_like(probs).scatter_(0, order[keep], sorted_probs[keep])
    generator = torch.Generator(device="cpu").manual_seed(seed)
    return int(torch.multinomial(probs.cpu(), 1, generator=generator))
