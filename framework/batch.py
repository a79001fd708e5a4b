"""Turn a :class:`SchedulePlan` into the flattened varlen batch the executor runs.

Everything an executor (or a tensor-parallel worker) needs is in :class:`StepBatch`: plain
tensors and small lists, no references to sequences or policies.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from .interfaces import BlockAllocator, SchedulePlan
from .request import SamplingParams
from .seeds import sample_seed


@dataclass
class StepBatch:
    input_ids: torch.Tensor  # [T] int64
    positions: torch.Tensor  # [T] int64
    slot_mapping: torch.Tensor  # [T] int64
    block_tables: torch.Tensor  # [B, max_blocks] int32
    cu_seqlens_q: torch.Tensor  # [B + 1] int32
    context_lens: torch.Tensor  # [B] int32
    max_query_len: int
    max_context_len: int
    sample_rows: torch.Tensor  # [S] int64: rows of the batch whose next token is sampled
    sampling: list[SamplingParams | None] = field(default_factory=list)  # per sample row; None = greedy
    sample_seeds: list[int] = field(default_factory=list)
    # Speculative decoding, per sampled sequence in order (empty when no entry verifies drafts):
    # a sequence with d drafts owns d + 1 consecutive sample rows (its last token and each draft).
    num_drafts: list[int] = field(default_factory=list)
    draft_token_ids: list[list[int]] = field(default_factory=list)
    draft_probs: list = field(default_factory=list)  # [d, vocab] tensors or None (one-hot drafts)
    swap_out: list[tuple[int, int]] = field(default_factory=list)
    swap_in: list[tuple[int, int]] = field(default_factory=list)
    copy_blocks: list[tuple[int, int]] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def has_drafts(self) -> bool:
        return bool(self.num_drafts)


def build_batch(plan: SchedulePlan, allocator: BlockAllocator, block_size: int, run_seed: int) -> StepBatch:
    """Flatten the plan's chunks; a sequence is sampled when its chunk reaches its last known token
    (a verify entry: at its last token and at every draft)."""
    entries = plan.scheduled
    num_seqs = len(entries)
    q_lens = np.fromiter((e.num_tokens for e in entries), dtype=np.int64, count=num_seqs)
    starts = np.fromiter((e.start for e in entries), dtype=np.int64, count=num_seqs)
    context_lens = starts + q_lens
    tables = [allocator.block_table(e.seq.id) for e in entries]
    max_blocks = max((len(t) for t in tables), default=1) or 1
    block_tables = np.zeros((num_seqs, max_blocks), dtype=np.int32)
    input_ids: list[int] = []
    sample_rows: list[int] = []
    sampling: list[SamplingParams | None] = []
    seeds: list[int] = []
    cu = np.zeros(num_seqs + 1, dtype=np.int64)
    np.cumsum(q_lens, out=cu[1:])
    verifies = any(e.draft_token_ids for e in entries)
    num_drafts: list[int] = []
    drafts: list[list[int]] = []
    draft_probs: list = []
    for i, (entry, table) in enumerate(zip(entries, tables)):
        block_tables[i, :len(table)] = table
        seq = entry.seq
        d = len(entry.draft_token_ids)
        if d:
            input_ids.append(seq.token_ids[entry.start])
            input_ids.extend(entry.draft_token_ids)
        else:
            input_ids.extend(seq.token_ids[entry.start:entry.start + entry.num_tokens])
        if entry.start + entry.num_tokens - d == seq.num_tokens:
            params = seq.request.sampling
            greedy = params.temperature == 0.0
            for row in range(d + 1):  # row r predicts the token at index num_tokens + r
                sample_rows.append(int(cu[i + 1]) - 1 - d + row)
                sampling.append(None if greedy else params)
                seeds.append(0 if greedy else sample_seed(run_seed, params.seed, seq.id, seq.num_tokens + row))
            if verifies:
                num_drafts.append(d)
                drafts.append(list(entry.draft_token_ids))
                probs = seq.draft_probs if d else None
                draft_probs.append(None if probs is None else probs[:d])
    seq_of_token = np.repeat(np.arange(num_seqs), q_lens)
    positions = np.arange(int(cu[-1]), dtype=np.int64) - np.repeat(cu[:-1] - starts, q_lens)
    slots = block_tables[seq_of_token, positions // block_size].astype(np.int64) * block_size + positions % block_size
    return StepBatch(
        input_ids=torch.tensor(input_ids, dtype=torch.long),
        positions=torch.from_numpy(positions),
        slot_mapping=torch.from_numpy(slots),
        block_tables=torch.from_numpy(block_tables),
        cu_seqlens_q=torch.from_numpy(cu.astype(np.int32)),
        context_lens=torch.from_numpy(context_lens.astype(np.int32)),
        max_query_len=int(q_lens.max(initial=0)),
        max_context_len=int(context_lens.max(initial=0)),
        sample_rows=torch.tensor(sample_rows, dtype=torch.long),
        sampling=sampling,
        sample_seeds=seeds,
        num_drafts=num_drafts,
        draft_token_ids=drafts,
        draft_probs=draft_probs,
        swap_out=plan.swap_out,
        swap_in=plan.swap_in,
        copy_blocks=plan.copy_blocks,
    )

