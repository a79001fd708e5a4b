"""The flattened varlen batch an executor with tensors runs for one step (:class:`StepBatch`).

It is part of the executor contract (:meth:`servelab.core.executor.Executor.execute`), so it lives
in ``core``; :func:`servelab.engine.batch.build_batch` makes one from a plan. Arrays are numpy (no
torch here); an executor moves them to its device.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from servelab.core.request import SamplingParams


@dataclass
class StepBatch:
    """One step, flattened: the tokens of every entry back to back (no padding).

    Index arrays are numpy (torch tensors are accepted too: executors convert with
    ``torch.as_tensor``). A sequence with ``d`` drafts owns ``d + 1`` consecutive sample rows.
    """

    input_ids: np.ndarray  # [T] int64
    positions: np.ndarray  # [T] int64
    slot_mapping: np.ndarray  # [T] int64
    block_tables: np.ndarray  # [B, max_blocks] int32
    cu_seqlens_q: np.ndarray  # [B + 1] int32
    context_lens: np.ndarray  # [B] int32
    max_query_len: int
    max_context_len: int
    sample_rows: np.ndarray  # [S] int64: rows of the batch whose next token is sampled
    sampling: list[SamplingParams | None] = field(default_factory=list)  # per sample row; None = greedy
    sample_seeds: list[int] = field(default_factory=list)
    # Speculative decoding, per sampled sequence in order (empty when no entry verifies drafts).
    num_drafts: list[int] = field(default_factory=list)
    draft_token_ids: list[list[int]] = field(default_factory=list)
    draft_probs: list[Any] = field(default_factory=list)  # [d, vocab] tensors or None (one-hot drafts)
    swap_out: list[tuple[int, int]] = field(default_factory=list)
    swap_in: list[tuple[int, int]] = field(default_factory=list)
    copy_blocks: list[tuple[int, int]] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def num_sampled(self) -> int:
        return int(self.sample_rows.shape[0])

    @property
    def has_drafts(self) -> bool:
        return bool(self.num_drafts)
