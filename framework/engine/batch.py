"""What the engine hands an executor for one step.

- :func:`step_work`: the step's features as numbers (:class:`~servelab.core.step_work.StepWork`),
  what time models price and what the simulator executes;
- :func:`build_batch`: the flattened varlen batch (:class:`~servelab.core.batch.StepBatch`) an executor with tensors
  runs. The engine reads each entry's block table from the allocator and passes the tables in;
  nothing here (and nothing an executor does) calls a policy plugin.

Arrays are numpy (no torch in the engine layer); an executor moves them to its device.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from servelab.core.batch import StepBatch
from servelab.core.interfaces import SchedulePlan, ScheduledSeq
from servelab.core.request import SamplingParams
from servelab.core.seeds import sample_seed
from servelab.core.step_work import StepWork


@dataclass
class _SampleRows:
    """The sampling part of a batch, filled entry by entry."""

    rows: list[int] = field(default_factory=list)
    sampling: list[SamplingParams | None] = field(default_factory=list)
    seeds: list[int] = field(default_factory=list)
    num_drafts: list[int] = field(default_factory=list)
    drafts: list[list[int]] = field(default_factory=list)
    draft_probs: list[Any] = field(default_factory=list)

    def add(self, entry: ScheduledSeq, last_row: int, run_seed: int, verifies: bool) -> None:
        """Rows of ``entry`` whose next token is sampled (its last token, then each draft)."""
        seq, d = entry.seq, len(entry.draft_token_ids)
        params = seq.request.sampling
        greedy = params.temperature == 0.0
        for row in range(d + 1):  # row r predicts the token at index num_tokens + r
            self.rows.append(last_row - d + row)
            self.sampling.append(None if greedy else params)
            self.seeds.append(0 if greedy else sample_seed(run_seed, params.seed, seq.id, seq.num_tokens + row))
        if verifies:
            self.num_drafts.append(d)
            self.drafts.append(list(entry.draft_token_ids))
            probs = seq.draft_probs if d else None
            self.draft_probs.append(None if probs is None else probs[:d])


def build_batch(plan: SchedulePlan, block_tables: list[list[int]], block_size: int, run_seed: int) -> StepBatch:
    """Flatten the plan's chunks; ``block_tables[i]`` is entry ``i``'s table (physical block ids
    in logical order). A sequence is sampled when its chunk reaches its last known token (a
    verify entry: at its last token and at every draft)."""
    entries = plan.scheduled
    num_seqs = len(entries)
    q_lens = np.fromiter((e.num_tokens for e in entries), dtype=np.int64, count=num_seqs)
    starts = np.fromiter((e.start for e in entries), dtype=np.int64, count=num_seqs)
    context_lens = starts + q_lens
    cu = np.zeros(num_seqs + 1, dtype=np.int64)
    np.cumsum(q_lens, out=cu[1:])
    tables = _pad_tables(block_tables, num_seqs)
    input_ids: list[int] = []
    samples = _SampleRows()
    verifies = any(e.draft_token_ids for e in entries)
    for i, entry in enumerate(entries):
        seq, d = entry.seq, len(entry.draft_token_ids)
        if d:
            input_ids.append(seq.token_ids[entry.start])
            input_ids.extend(entry.draft_token_ids)
        else:
            input_ids.extend(seq.token_ids[entry.start:entry.start + entry.num_tokens])
        if entry.start + entry.num_tokens - d == seq.num_tokens:
            samples.add(entry, int(cu[i + 1]) - 1, run_seed, verifies)
    seq_of_token = np.repeat(np.arange(num_seqs), q_lens)
    positions = np.arange(int(cu[-1]), dtype=np.int64) - np.repeat(cu[:-1] - starts, q_lens)
    slots = tables[seq_of_token, positions // block_size].astype(np.int64) * block_size + positions % block_size
    return StepBatch(
        input_ids=np.array(input_ids, dtype=np.int64), positions=positions, slot_mapping=slots,
        block_tables=tables, cu_seqlens_q=cu.astype(np.int32), context_lens=context_lens.astype(np.int32),
        max_query_len=int(q_lens.max(initial=0)), max_context_len=int(context_lens.max(initial=0)),
        sample_rows=np.array(samples.rows, dtype=np.int64), sampling=samples.sampling, sample_seeds=samples.seeds,
        num_drafts=samples.num_drafts, draft_token_ids=samples.drafts, draft_probs=samples.draft_probs,
        swap_out=plan.swap_out, swap_in=plan.swap_in, copy_blocks=plan.copy_blocks,
    )


def _pad_tables(block_tables: list[list[int]], num_seqs: int) -> np.ndarray:
    """``[B, max_blocks]`` int32, zero-padded (a padded slot is never read: context lengths bound it)."""
    max_blocks = max((len(t) for t in block_tables), default=1) or 1
    tables = np.zeros((num_seqs, max_blocks), dtype=np.int32)
    for i, table in enumerate(block_tables):
        tables[i, :len(table)] = table
    return tables


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
        if end == seq.num_tokens:
            sampled += 1
    return StepWork(tokens, len(plan.scheduled), prefill, decode, sampled, attended, context,
                    len(plan.swap_out), len(plan.swap_in), len(plan.copy_blocks), drafts)
