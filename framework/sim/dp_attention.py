"""Data-parallel attention beside expert parallelism (``data_parallel_attention=true``): which share of
an engine step the slowest data-parallel rank runs.

The engine schedules one batch; under data-parallel attention its sequences are spread over the ``ranks``
(SGLang's ``--enable-dp-attention``: each rank its own sequences and their KV), balanced by tokens with
every sequence whole on one rank. The step's attention and dense part cost the slowest rank's share; the
MoE layers see every rank's tokens through the expert-parallel all-to-all. The step's features are sums
(:class:`servelab.core.step_work.StepWork` carries no per-sequence sizes), so the slowest rank's share is
bounded from them:

- **tokens**: ``max(ceil(tokens / ranks), ceil(chunk tokens / chunks))``: an even split, unless a prompt
  chunk (its mean size standing for it) cannot be split below that;
- **sequences, sampled rows**: ``ceil(count / ranks)`` (decode sequences one token each);
- **attention work** (``attended``, ``context_tokens``): the step's, times the rank's token share
  ``rank tokens / tokens`` (a decode-only step: ``ceil(seqs / ranks) / seqs``), i.e. its sequences'
  contexts taken as the step's mean.
"""

from __future__ import annotations

from math import ceil

from servelab.core.step_work import StepWork


def slowest_rank_work(work: StepWork, ranks: int) -> StepWork:
    """The share of ``work`` the slowest of ``ranks`` data-parallel attention ranks runs (module doc);
    swaps and copies stay the step's (its block counts are already one rank's)."""
    n, seqs = work.num_tokens, work.num_seqs
    if ranks <= 1 or not n:
        return work
    chunks = seqs - work.decode_seqs
    chunk_tokens = n - work.decode_seqs
    tokens = min(n, max(ceil(n / ranks), ceil(chunk_tokens / chunks) if chunks > 0 else 0))
    share = tokens / n
    return StepWork(num_tokens=tokens, num_seqs=min(seqs, ceil(seqs / ranks)),
                    prefill_tokens=round(work.prefill_tokens * share),
                    decode_seqs=min(work.decode_seqs, ceil(work.decode_seqs / ranks)),
                    num_sampled=min(work.num_sampled, ceil(work.num_sampled / ranks)),
                    attended=round(work.attended * share), context_tokens=round(work.context_tokens * share),
                    swap_out_blocks=work.swap_out_blocks, swap_in_blocks=work.swap_in_blocks,
                    copy_blocks=work.copy_blocks, draft_tokens=round(work.draft_tokens * share))
