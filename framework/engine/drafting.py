"""Running a draft model beside the target (``drafter=draft_model``).

The draft model keeps its own KV tensors, addressed through the *same* block tables as the
target's: every step the worker runs the draft model over the target's batch too (a mirror
pass), so the draft KV is valid exactly where the target's is — after prefix-cache hits, swaps,
recomputation and rollbacks alike. Drafting then needs only the sequence's last token: ``k``
one-token steps batched across sequences. Positions past a sequence's allocated blocks land in
per-sequence *scratch* blocks after the pool's (never read once the step is over: the mirror
pass of the verify step rewrites every position it keeps).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from servelab.core.interfaces import BlockAllocator
from servelab.core.request import SamplingParams, Sequence
from servelab.core.seeds import sample_seed

DRAFT_SEED_SALT = 0x5EED_D4AF  # draft sampling never reuses a verification seed
MAX_DRAFT_TOKENS = 16  # the largest drafter.k: beyond it verification costs more than any acceptance rate we see saves


@dataclass
class DraftBatch:
    """What a worker needs to draft ``k`` tokens for each of ``B`` sequences."""

    last_token_ids: list[int]  # [B]
    positions: list[int]  # [B] position of the last token (its KV is not yet computed)
    block_tables: list[list[int]]  # [B] the target's tables (device blocks)
    sampling: list[SamplingParams | None]  # [B] None = greedy
    seeds: list[list[int]]  # [B][k] one seed per draft
    k: int


def build_draft_batch(seqs: list[Sequence], allocator: BlockAllocator, k: int, run_seed: int) -> DraftBatch:
    sampling: list[SamplingParams | None] = []
    seeds: list[list[int]] = []
    for seq in seqs:
        params = seq.request.sampling
        greedy = params.temperature == 0.0
        sampling.append(None if greedy else params)
        seeds.append([] if greedy else [sample_seed(run_seed ^ DRAFT_SEED_SALT, params.seed, seq.id, seq.num_tokens + j)
                                        for j in range(k)])
    return DraftBatch(
        last_token_ids=[seq.token_ids[-1] for seq in seqs],
        positions=[seq.num_tokens - 1 for seq in seqs],
        block_tables=[list(allocator.block_table(seq.id)) for seq in seqs],
        sampling=sampling, seeds=seeds, k=k)


def scratch_blocks_per_seq(k: int, block_size: int) -> int:
    """Blocks one sequence may need past its own table while drafting ``k`` tokens."""
    return -(-(k + 1) // block_size) + 1


def draft_tables(batch: DraftBatch, block_size: int, first_scratch: int, per_seq: int) -> np.ndarray:
    """Each sequence's table, extended with its scratch blocks to cover ``position + k``."""
    need = [(p + batch.k) // block_size + 1 for p in batch.positions]
    tables = np.zeros((len(need), max(need)), dtype=np.int64)
    for i, (table, n) in enumerate(zip(batch.block_tables, need)):
        own = table[:n]
        tables[i, :len(own)] = own
        extra = n - len(own)
        if extra > per_seq:
            raise RuntimeError(f"drafting needs {extra} scratch blocks for one sequence, {per_seq} reserved")
        tables[i, len(own):n] = first_scratch + i * per_seq + np.arange(extra)
    return tables
