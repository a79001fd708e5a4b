"""What one engine step does, as numbers a time model can price (:class:`StepWork`; the engine
counts it from the plan with :func:`servelab.engine.batch.step_work`)."""

from __future__ import annotations

from dataclasses import dataclass


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


@dataclass(frozen=True, slots=True)
class DraftWork:
    """What proposing the next step's drafts did (speculative decoding), for a time model to price.

    ``num_seqs`` sequences got drafts, ``draft_tokens`` in all; a drafter that runs a draft model
    (``runs_model``) made ``num_passes`` batched forward passes of it over those sequences, whose
    contexts sum to ``context_tokens``. A drafter without a model (n-gram lookup) only spends host time.
    """

    num_seqs: int = 0
    draft_tokens: int = 0
    num_passes: int = 0
    context_tokens: int = 0
    runs_model: bool = False
