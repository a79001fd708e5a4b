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
    swap_out: list[tuple[int, int]] = field(default_factory=list)
    swap_in: list[tuple[int, int]] = field(default_factory=list)
    copy_blocks: list[tuple[int, int]] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def all_greedy(self) -> bool:
        return all(s is None for s in self.sampling)


def build_batch(plan: SchedulePlan, allocator: BlockAllocator, block_size: int, run_seed: int) -> StepBatch:
    """Flatten the plan's chunks; a sequence is sampled when its chunk reaches its last known token."""
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
    for i, (entry, table) in enumerate(zip(entries, tables)):
        block_tables[i, :len(table)] = table
        seq = entry.seq
        input_ids.extend(seq.token_ids[entry.start:entry.start + entry.num_tokens])
        if entry.start + entry.num_tokens == seq.num_tokens:
            sample_rows.append(int(cu[i + 1]) - 1)
            params = seq.request.sampling
            greedy = params.temperature == 0.0
            sampling.append(None if greedy else params)
            seeds.append(0 if greedy else _sample_seed(run_seed, params.seed, seq.id, seq.num_tokens))
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
        swap_out=plan.swap_out,
        swap_in=plan.swap_in,
        copy_blocks=plan.copy_blocks,
    )


def _sample_seed(run_seed: int, request_seed: int | None, seq_id: str, position: int) -> int:
    """A seed that depends only on the request and position, never on batching."""
    import zlib

    base = request_seed if request_seed is not None else run_seed
    return (base * 1_000_003 + zlib.crc32(seq_id.encode()) * 7919 + position) % (2**63 - 1)
