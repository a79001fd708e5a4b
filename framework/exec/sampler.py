"""Next-token selection: greedy argmax, or temperature / top-k / top-p sampling with per-token
seeds; and the verification of speculative drafts (:func:`sample_and_verify`)."""

from __future__ import annotations

import numpy as np
import torch

from servelab.core.request import SamplingParams


def sample(logits: torch.Tensor, params: list[SamplingParams | None], seeds: list[int]) -> list[int]:
    """Pick one token per row of ``logits [S, vocab]``; rows with ``None`` params are greedy.

    Sampled rows draw by inverse CDF with a uniform derived from ``seeds[row]`` alone
    (:func:`seeded_uniforms`), so a request's result never depends on what else was in the batch
    — nor on whether the step verified drafts (:func:`verify_sampled` draws the same way).
    """
    tokens = logits.argmax(dim=-1).tolist()
    sampled = [(row, p) for row, p in enumerate(params) if p is not None]
    rows = [row for row, _ in sampled]
    if rows:
        probs = target_probs_batch(logits[torch.tensor(rows, device=logits.device)], [p for _, p in sampled])
        drawn = sample_from(probs, seeded_uniforms(np.array([seeds[r] for r in rows], dtype=np.uint64), 1))
        for row, token in zip(rows, drawn):
            tokens[row] = token
    return tokens


def sample_and_verify(logits: torch.Tensor, batch) -> tuple[list[int], list[int] | None]:
    """The tokens of one step, and for each sampled sequence how many of its drafts were accepted.

    Without drafts in ``batch`` this is :func:`sample` (and ``None``). With drafts, a sequence with
    ``d`` drafts owns ``d + 1`` consecutive rows of ``logits`` and yields its accepted drafts plus
    one token of the target's own (the correction at the first rejection, or the bonus token after
    all ``d``): greedy rows accept a draft equal to the argmax; sampled rows use speculative
    rejection sampling (Leviathan et al. 2023; Chen et al. 2023), which leaves the output
    distribution exactly the target's, batched over every sampled sequence of the step.
    """
    if not batch.has_drafts:
        return sample(logits, batch.sampling, batch.sample_seeds), None
    greedy_tokens = logits.argmax(dim=-1).tolist()
    groups, row = [], 0
    for d, drafts, q in zip(batch.num_drafts, batch.draft_token_ids, batch.draft_probs):
        groups.append((row, d, drafts, q, batch.sampling[row]))
        row += d + 1
    sampled = [g for g in groups if g[4] is not None]
    verified = iter(verify_sampled(logits, sampled, batch.sampling, batch.sample_seeds) if sampled else ())
    tokens: list[int] = []
    accepted: list[int] = []
    for row, d, drafts, _, params in groups:
        if params is None:
            targets = greedy_tokens[row:row + d + 1]
            a = accept_greedy(targets, drafts)
            tokens.extend(targets[:a + 1])
        else:
            out = next(verified)
            a = len(out) - 1
            tokens.extend(out)
        accepted.append(a)
    return tokens, accepted


def verify_sampled(logits: torch.Tensor, groups, sampling, seeds) -> list[list[int]]:
    """Rejection-sample every sampled sequence's drafts at once; per group (``(first row, d,
    drafts, q or None, params)``): its accepted drafts plus one target token.

    Draft i is kept when ``u < p(x) / q(x)`` (``q`` one-hot when the drafter gave none); at the
    first rejection the token is drawn from ``max(0, p - q)`` renormalised, after all ``d`` from
    ``p``. Each row's two uniforms come from its seed (counter-based, :func:`seeded_uniforms`), so
    results depend on the request and position only, never on the batch.
    """
    rows = torch.tensor([r for row, d, *_ in groups for r in range(row, row + d + 1)], dtype=torch.long)
    probs = target_probs_batch(logits[rows.to(logits.device)], [sampling[r] for r in rows.tolist()])
    row_seeds = np.array([seeds[r] for r in rows.tolist()], dtype=np.uint64)
    u_accept, u_draw = seeded_uniforms(row_seeds, 0), seeded_uniforms(row_seeds, 1)
    offsets = np.cumsum([0] + [d + 1 for _, d, *_ in groups])
    draft_rows: np.ndarray | list[int] = np.concatenate([np.arange(o, o + d) for o, (_, d, *_) in zip(offsets, groups)]) if len(groups) else []
    draft_ids = torch.tensor([x for _, _, drafts, *_ in groups for x in drafts], dtype=torch.long)
    p_x = probs[torch.as_tensor(draft_rows, dtype=torch.long), draft_ids].double().numpy()
    q_x = np.concatenate([np.ones(d) if q is None else q[torch.arange(d), torch.tensor(drafts)].double().numpy()
                          for _, d, drafts, q, _ in groups]) if len(draft_ids) else np.zeros(0)
    keep = u_accept[draft_rows] * q_x < p_x
    out, final_rows, final_dists = [], [], []
    start = 0
    for offset, (_, d, drafts, q, _) in zip(offsets, groups):
        kept = keep[start:start + d]
        a = d if kept.all() else int(np.argmin(kept))
        start += d
        out.append(list(drafts[:a]))
        dist = probs[offset + a]
        if a < d:  # the correction: what p has beyond q
            residual = dist.clone()
            if q is None:
                residual[drafts[a]] = 0.0
            else:
                residual = (residual - q[a].to(residual)).clamp_(min=0.0)
            dist = residual if float(residual.sum()) > 0.0 else dist  # p == q up to rounding: p is exact
        final_rows.append(offset + a)
        final_dists.append(dist)
    drawn = sample_from(torch.stack(final_dists), u_draw[final_rows])
    for tokens, token in zip(out, drawn):
        tokens.append(token)
    return out


def seeded_uniforms(seeds: np.ndarray, stream: int) -> np.ndarray:
    """One uniform in [0, 1) per seed and stream (SplitMix64 of ``2 * seed + stream``): a
    counter-based generator, so a batch of rows needs no per-row generator object."""
    with np.errstate(over="ignore"):
        z = seeds.astype(np.uint64) * np.uint64(2) + np.uint64(stream) + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return (z >> np.uint64(11)).astype(np.float64) / float(2**53)


def sample_from(probs: torch.Tensor, uniforms: np.ndarray) -> list[int]:
    """Inverse-CDF draws: row i takes the first token whose cumulative (unnormalised) probability
    exceeds ``uniforms[i]`` times the row's total; a zero-probability token is never drawn."""
    cdf = probs.double().cumsum(-1)
    targets = torch.from_numpy(np.asarray(uniforms, dtype=np.float64)).unsqueeze(-1) * cdf[:, -1:]
    index = torch.searchsorted(cdf, targets, right=True).squeeze(-1)
    return index.clamp_(max=probs.shape[-1] - 1).tolist()


def target_probs_batch(logits: torch.Tensor, params: list[SamplingParams]) -> torch.Tensor:
    """:func:`target_probs` for every row at once (each row its own temperature / top-k / top-p)."""
    vocab = logits.shape[-1]
    temps = torch.tensor([max(p.temperature, 1e-5) for p in params], dtype=torch.float32)
    logits = logits.float().cpu() / temps.unsqueeze(-1)
    top_k = torch.tensor([p.top_k if 0 < p.top_k < vocab else vocab for p in params])
    if bool((top_k < vocab).any()):
        kth = logits.sort(dim=-1, descending=True).values.gather(1, (top_k - 1).unsqueeze(-1))
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = logits.softmax(-1)
    top_p = torch.tensor([p.top_p for p in params], dtype=torch.float32)
    if bool((top_p < 1.0).any()):
        sorted_probs, order = probs.sort(dim=-1, descending=True)
        drop = (sorted_probs.cumsum(-1) - sorted_probs >= top_p.unsqueeze(-1)) & (top_p < 1.0).unsqueeze(-1)
        probs = probs.scatter(1, order, sorted_probs.masked_fill(drop, 0.0))
    return probs


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
