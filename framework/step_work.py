"""What one engine step does, as numbers a time model can price (:class:`StepWork`)."""

from __future__ import annotations

from dataclasses import dataclass

from .interfaces import SchedulePlan


@dataclass(frozen=True, slots=True)
class StepWork:
    """The features of one step.

    ``attended`` is the attention work: the sum over computed tokens of the context each attends to
    (causal). ``context_tokens`` is the KV each scheduled sequence reads once per layer (its context
    after the step). Block counts are per rank; the time model knows the bytes per block.
    A verify entry (speculative decoding) counts as one decode sequence plus ``draft_tokens``:
    its drafts are computed like a short prompt chunk but are not prefill.
    """

    num_tokens: int = 0
    num_seqs: int = 0
    prefill_tokens: int = 0
    decode_seqs: int = 0
    num_sampled: int = 0
    attended: int = 0
    context_tokens: int = 0
    swap_out_blocks: int = 0
    swap_in_blocks: int = 0
    copy_blocks: int = 0
    draft_tokens: int = 0

    @property
    def swap_blocks(self) -> int:
        return self.swap_out_blocks + self.swap_in_blocks


def step_work(plan: SchedulePlan) -> StepWork:
    """Count what ``plan`` computes (one pass over its entries)."""
    tokens = prefill = decode = sampled = attended = context = drafts = 0
    for e in plan.scheduled:  # runs once per step: attribute lookups kept to a minimum
        n, start, seq = e.num_tokens, e.start, e.seq
        end = start + n
        tokens += n
        context += end
        if e.draft_token_ids:
            d = len(e.draft_token_ids)
            drafts += d
            decode += 1
            sampled += d + 1  # logit rows: the last token and every draft
            attended += n * start + n * (n + 1) // 2
            continue
        if n == 1:
            attended += end
            if start >= len(seq.request.prompt_token_ids):
                decode += 1
            else:
                prefill += 1
        else:
            attended += n * start + n * (n + 1) // 2
            prefill += n
        if end == len(seq.token_ids):
            sampled += 1
    return StepWork(tokens, len(plan.scheduled), prefill, decode, sampled, attended, context,
                    len(plan.swap_out), len(plan.swap_in), len(plan.copy_blocks), drafts)
