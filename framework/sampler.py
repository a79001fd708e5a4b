"""Next-token selection: greedy argmax, or temperature / top-k / top-p sampling with per-token
seeds; and the verification of speculative drafts (:func:`sample_and_verify`)."""

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


def sample_and_verify(logits: torch.Tensor, batch) -> tuple[list[int], list[int] | None]:
    """The tokens of one step, and for each sampled sequence how many of its drafts were accepted.

    Without drafts in ``batch`` this is :func:`sample` (and ``None``). With drafts, a sequence with
    ``d`` drafts owns ``d + 1`` consecutive rows of ``logits`` and yields its accepted drafts plus
    one token of the target's own (the correction at the first rejection, or the bonus token after
    all ``d``): greedy rows accept a draft equal to the argmax; sampled rows use speculative
    rejection sampling (Leviathan et al. 2023; Chen et al. 2023), which leaves the output
    distribution exactly the target's. Every row draws from its own seeded generator.
    """
    if not batch.has_drafts:
        return sample(logits, batch.sampling, batch.sample_seeds), None
    greedy_tokens = logits.argmax(dim=-1).tolist()
    tokens: list[int] = []
    accepted: list[int] = []
    row = 0
    for d, drafts, q in zip(batch.num_drafts, batch.draft_token_ids, batch.draft_probs):
        params = batch.sampling[row]
        if params is None:
            targets = greedy_tokens[row:row + d + 1]
            a = accept_greedy(targets, drafts)
            tokens.extend(targets[:a + 1])
        else:
            out = _verify_sampled(logits[row:row + d + 1], drafts, q, params, batch.sample_seeds[row:row + d + 1])
            a = len(out) - 1
            tokens.extend(out)
        accepted.append(a)
        row += d + 1
    return tokens, accepted


def verify_row_tokens(row_tokens: list[int], batch) -> tuple[list[int], list[int] | None]:
    """Greedy verification when an executor has one token per sample row (no logits): each
    sequence keeps its drafts up to the first disagreement, plus the target's token there."""
    if not batch.has_drafts:
        return row_tokens, None
    tokens: list[int] = []
    accepted: list[int] = []
    row = 0
    for d, drafts in zip(batch.num_drafts, batch.draft_token_ids):
        targets = row_tokens[row:row + d + 1]
        a = accept_greedy(targets, drafts)
        tokens.extend(targets[:a + 1])
        accepted.append(a)
        row += d + 1
    return tokens, accepted


def accept_greedy(targets: list[int], drafts: list[int]) -> int:
    """How many leading ``drafts`` equal the target's tokens (``targets[i]`` follows draft ``i-1``)."""
    a = 0
    for draft, target in zip(drafts, targets):
        if draft != target:
            break
        a += 1
    return a


def _verify_sampled(logits: torch.Tensor, drafts: list[int], q, params: SamplingParams,
                    seeds: list[int]) -> list[int]:
    """Rejection-sample the drafts of one sequence; returns accepted drafts + one target token."""
    out: list[int] = []
    for i, x in enumerate(drafts):
        p = target_probs(logits[i], params)
        generator = torch.Generator(device="cpu").manual_seed(seeds[i])
        q_x = 1.0 if q is None else float(q[i, x])
        if float(torch.rand(1, generator=generator)) * q_x < float(p[x]):  # u < p(x) / q(x)
            out.append(x)
            continue
        residual = p.clone()
        if q is None:
            residual[x] = 0.0
        else:
            residual = (residual - q[i].to(residual)).clamp_(min=0.0)
        if float(residual.sum()) <= 0.0:  # p == q up to rounding: any draw from p is exact
            residual = p
        out.append(int(torch.multinomial(residual, 1, generator=generator)))
        return out
    generator = torch.Generator(device="cpu").manual_seed(seeds[len(drafts)])
    out.append(int(torch.multinomial(target_probs(logits[len(drafts)], params), 1, generator=generator)))
    return out


def target_probs(logits: torch.Tensor, p: SamplingParams) -> torch.Tensor:
    """The distribution a sampled row draws from: temperature, then top-k, then top-p (float32, CPU)."""
    logits = logits.float() / max(p.temperature, 1e-5)
    if 0 < p.top_k < logits.shape[-1]:
        kth = torch.topk(logits, p.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = logits.softmax(-1)
    if p.top_p < 1.0:
        sorted_probs, order = probs.sort(descending=True)
        keep = sorted_probs.cumsum(-1) - sorted_probs < p.top_p  # always keeps the top token
        probs = torch.zeros_like(probs).scatter_(0, order[keep], sorted_probs[keep])
    return probs.cpu()


def _sample_row(logits: torch.Tensor, p: SamplingParams, seed: int) -> int:
    generator = torch.Generator(device="cpu").manual_seed(seed)
    return int(torch.multinomial(target_probs(logits, p), 1, generator=generator))
