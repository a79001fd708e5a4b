"""The executor boundary as the engine sees it: :class:`Executor` and what a step returns.

The engine hands an executor a finished step and gets tokens back; an executor never calls a
policy plugin. Two kinds:

- executors with tensors (``needs_batch = True``: one process, tensor parallel, the test doubles)
  get a :class:`~servelab.engine.batch.StepBatch` — the flattened varlen batch with the block
  tables the engine read from the allocator — in :meth:`Executor.execute`;
- executors without tensors (``needs_batch = False``: the simulator) get the step's
  :class:`~servelab.core.step_work.StepWork` in :meth:`Executor.execute_work` and never see a batch.

No torch here: the engine imports this module on every backend.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from servelab.core.errors import ConfigError

if TYPE_CHECKING:
    from servelab.core.interfaces import Drafts
    from servelab.core.step_work import StepWork


@dataclass
class StepOutput:
    """``sampled``: the step's new tokens in plan order; a verify entry contributes its accepted
    drafts plus one, and ``accepted`` (one count per sampled sequence) says how many it accepted
    (``None`` when the step verified no drafts: one token per sampled sequence)."""

    sampled: list[int]
    model_s: float
    comm_s: float = 0.0
    accepted: list[int] | None = None


class Executor(ABC):
    """What the engine talks to. Implementations: ``servelab.exec.executor.LocalExecutor``,
    ``servelab.exec.tp.TPExecutor``, ``servelab.sim.executor.SimExecutor``, and the test doubles
    in ``servelab.kit.testing``.

    ``spec`` is the model's :class:`~servelab.core.model_spec.ModelSpec` (vocabulary, EOS ids,
    shape); ``num_kv_blocks`` / ``bytes_per_block`` size the allocator's pool; ``num_swap_blocks``
    is the host swap pool a plan's swap copies may use.
    """

    #: True: the engine builds a :class:`~servelab.engine.batch.StepBatch` and calls :meth:`execute`;
    #: False: it calls :meth:`execute_work` with the step's features only (no tensors to fill).
    needs_batch: ClassVar[bool] = True

    spec: object
    num_kv_blocks: int
    bytes_per_block: int
    num_swap_blocks: int = 0

    @abstractmethod
    def execute(self, batch) -> StepOutput:
        """Run one :class:`~servelab.engine.batch.StepBatch`: apply its block copies, run the
        forward pass, return the sampled token of each of ``batch.sample_rows``, in order."""

    def execute_work(self, work: "StepWork") -> StepOutput:
        """A step described only by its features (``needs_batch = False`` executors)."""
        raise NotImplementedError(f"{type(self).__name__} runs batches (needs_batch = True)")

    def measure_swap_bandwidth(self) -> float:
        """Device <-> host copy bandwidth (bytes/s), measured with a real copy. Default: a host
        memory copy of 32 MiB."""
        src = np.random.default_rng(0).random(4 * 2**20)
        dst = np.empty_like(src)
        np.copyto(dst, src)  # warm-up: page faults are not bandwidth
        start = time.perf_counter()
        np.copyto(dst, src)
        return src.nbytes / max(time.perf_counter() - start, 1e-9)

    def draft(self, batch) -> "Drafts":
        """Draft ``batch.k`` tokens per sequence of a :class:`~servelab.engine.drafting.DraftBatch`
        with the draft model loaded beside the target."""
        raise ConfigError(f"drafter=draft_model: executor {type(self).__name__} runs no draft model")

    def shutdown(self) -> None:
        """Release workers and resources (idempotent)."""
