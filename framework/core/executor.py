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
from abc import abstractmethod
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, Optional

import numpy as np

from servelab.core.contexts import ExecutorContext
from servelab.core.errors import ConfigError
from servelab.core.interfaces import Plugin
from servelab.core.shapes import ModelShape

if TYPE_CHECKING:
    from servelab.core.batch import StepBatch
    from servelab.core.interfaces import Drafts
    from servelab.core.model_spec import ModelSpec
    from servelab.core.step_work import StepWork
    from servelab.engine.drafting import DraftBatch


@dataclass
class BackendConfig:
    """``backend=<executor>``: what every executor reads (``torch``/``local``/``tp`` run the model,
    TP coming with ``tensor_parallel_size``; ``sim`` prices steps and reads only the last fields)."""

    name: str = "torch"
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    kv_cache_memory_gb: float = 0.5  # CPU: KV pool budget when num_kv_blocks is null
    gpu_memory_utilization: float = 0.9  # CUDA: fraction of device memory the run may use
    # host swap pool: num_swap_blocks (blocks) or swap_space_gb (GiB), not both; both null = none,
    # except preemption=swap|adaptive: 4 GiB capped at half the free host memory (``servelab.assemble.swap_pool``)
    num_swap_blocks: Optional[int] = None
    swap_space_gb: Optional[float] = None
    swap_bandwidth_gb_s: Optional[float] = None  # device<->host link; null = measured at start-up
    num_threads: Optional[int] = None  # torch intra-op threads (per rank); null = torch's default (TP: cores / ranks)
    tp_step_timeout_s: float = 120.0  # tensor parallel: longest wait on another rank in a step before the run fails
    activation_reserve_gb: float = 2.0  # sim: device memory per rank kept for activations (not weights, not KV)
    trace_rows: Optional[int] = 200  # workload=trace's default num_requests (sim: null = the whole trace)


@dataclass
class StepOutput:
    """``sampled``: the step's new tokens in plan order; a verify entry contributes its accepted
    drafts plus one, and ``accepted`` (one count per sampled sequence) says how many it accepted
    (``None`` when the step verified no drafts: one token per sampled sequence)."""

    sampled: list[int]
    model_s: float
    comm_s: float = 0.0
    accepted: list[int] | None = None


class Executor(Plugin):
    """What the engine talks to: a plugin kind (``backend=<name>``) built as
    ``Executor(config, context)`` with a :class:`~servelab.core.executor.BackendConfig` and an
    :class:`~servelab.core.contexts.ExecutorContext`. Built-ins: ``local`` / ``tp``
    (``servelab.exec``: one process, N ranks; ``torch`` picks one by ``tensor_parallel_size``) and
    ``sim`` (``servelab.sim``); the test doubles live in ``servelab.testing``.

    ``spec`` is the model's :class:`~servelab.core.model_spec.ModelSpec` (vocabulary, EOS ids,
    shape); ``num_kv_blocks`` / ``bytes_per_block`` size the allocator's pool; ``num_swap_blocks``
    is the host swap pool a plan's swap copies may use.
    """

    Config: ClassVar[type] = BackendConfig
    context_type = ExecutorContext

    #: True: the engine builds a :class:`~servelab.core.batch.StepBatch` and calls :meth:`execute`;
    #: False: it calls :meth:`execute_work` with the step's features only (no tensors to fill).
    needs_batch: ClassVar[bool] = True
    #: False: the sampled tokens are placeholders (the simulator); text is never decoded from them.
    computes_tokens: ClassVar[bool] = True
    #: Not None (the simulator): :meth:`execute_work` is a pure function that answers every
    #: sampled row with this token and no measured time (``model_s = comm_s = 0``), so the
    #: engine's fast-forward (``sim.fast_forward``) may skip calling it for quiet decode steps.
    placeholder_token: ClassVar[int | None] = None

    spec: "ModelSpec"
    num_kv_blocks: int
    bytes_per_block: int
    num_swap_blocks: int = 0

    @property
    def kv_pool(self) -> Any:
        """The device KV pool (:class:`servelab.exec.kv_pool.KVPool`) when it lives in this process
        as one worker's, for KV connectors that copy blocks in and out (tiers, P/D hand-offs);
        None otherwise (the simulator, several ranks). Default: None."""
        return None

    @property
    def shape(self) -> "ModelShape":
        """The model's sizes (what a time model prices)."""
        return ModelShape.from_spec(self.spec)

    @property
    def draft_shape(self) -> "ModelShape | None":
        """The draft model's sizes when one runs beside the target (``drafter=draft_model``)."""
        return None

    def describe(self) -> dict[str, str]:
        """What the start-up banner says of where steps run (``{"device": ..., "attention": ...}``)."""
        return {}

    def summary(self) -> dict[str, Any]:
        """Keys this executor adds to ``summary.json`` (default none)."""
        return {}

    @abstractmethod
    def execute(self, batch: "StepBatch") -> StepOutput:
        """Run one :class:`~servelab.core.batch.StepBatch`: apply its block copies, run the
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

    def draft(self, batch: "DraftBatch") -> "Drafts":
        """Draft ``batch.k`` tokens per sequence of a :class:`~servelab.engine.drafting.DraftBatch`
        with the draft model loaded beside the target."""
        raise ConfigError(f"drafter=draft_model: executor {type(self).__name__} runs no draft model")

    def close(self) -> None:
        """Release workers and resources (idempotent): :meth:`shutdown`, by its usual name."""
        self.shutdown()

    def shutdown(self) -> None:
        """Release workers and resources (idempotent)."""
