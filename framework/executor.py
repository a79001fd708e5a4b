"""The executor boundary: it owns the model weights and the KV tensors and runs a :class:`StepBatch`.

:class:`ModelWorker` is one rank's model + KV cache (used as is in one process, and by every
rank of tensor parallelism); :class:`LocalExecutor` runs one worker in this process. Policies
never see which executor runs.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch

from .batch import StepBatch, build_batch
from .kernels import select_attention_backend
from .model.layers import TPGroup
from .model.llama import AttentionMetadata, local_heads
from .model.loader import load_model
from .model.spec import ModelSpec
from .errors import ConfigError
from .sampler import sample

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class WorkerConfig:
    """Everything a worker needs to build itself (picklable, so TP workers get the same)."""

    model_path: str
    dtype: str
    device: str
    attention_backend: str
    block_size: int
    max_model_len: int
    num_kv_blocks: int | None
    kv_cache_memory_gb: float
    gpu_memory_utilization: float
    num_swap_blocks: int
    seed: int
    swap_space_gb: float | None = None  # host pool in GiB; overrides num_swap_blocks when set


@dataclass
class StepOutput:
    sampled: list[int]
    model_s: float
    comm_s: float = 0.0


class ModelWorker:
    """One rank: loads its shard of the model, allocates its KV pool, runs batches."""

    def __init__(self, cfg: WorkerConfig, tp: TPGroup | None = None) -> None:
        self.cfg = cfg
        self.tp = tp or TPGroup()
        self.device = resolve_device(cfg.device)
        self.dtype = DTYPES[cfg.dtype]
        if self.device.type == "cpu" and self.dtype == torch.float16:
            raise ConfigError("model.dtype=float16 is not supported on CPU; use float32 or bfloat16")
        torch.manual_seed(cfg.seed)
        self.ops = select_attention_backend(cfg.attention_backend, self.device)
        self.model = load_model(cfg.model_path, self.tp, self.dtype, self.device, cfg.max_model_len)
        self.spec: ModelSpec = self.model.spec
        if self.ops.name == "triton":
            from .kernels.triton_ops import check_supported

            try:
                check_supported(self.spec.head_dim, cfg.block_size)
            except ValueError as exc:
                raise ConfigError(f"attention_backend=triton: {exc}") from None
        self.kv_cache: list[tuple[torch.Tensor, torch.Tensor]] = []
        self.host_cache: torch.Tensor | None = None

    # ---- memory -------------------------------------------------------------------------
    def bytes_per_block(self) -> int:
        _, kv_heads = local_heads(self.spec, self.tp)
        elem = torch.tensor([], dtype=self.dtype).element_size()
        return 2 * self.spec.num_layers * self.cfg.block_size * kv_heads * self.spec.head_dim * elem

    def available_kv_blocks(self) -> int:
        """Blocks this rank could hold: ``num_kv_blocks`` if set, else from the memory budget."""
        if self.cfg.num_kv_blocks is not None:
            return self.cfg.num_kv_blocks
        if self.device.type == "cuda":
            free, total = torch.cuda.mem_get_info(self.device)
            budget = free - (1 - self.cfg.gpu_memory_utilization) * total
        else:
            budget = self.cfg.kv_cache_memory_gb * 2**30
        return max(0, int(budget // self.bytes_per_block()))

    def swap_pool_blocks(self) -> int:
        """Host swap pool size in blocks: ``swap_space_gb`` if set, else ``num_swap_blocks``."""
        if self.cfg.swap_space_gb is not None:
            return int(self.cfg.swap_space_gb * 2**30 // self.bytes_per_block())
        return self.cfg.num_swap_blocks

    def measure_swap_bandwidth(self, num_bytes: int = 32 * 2**20, repeats: int = 3) -> float:
        """Bytes per second of a real device -> host copy on this machine (best of ``repeats``)."""
        src = torch.empty(num_bytes // 4, dtype=torch.float32, device=self.device).uniform_()
        dst = torch.empty(src.shape, dtype=src.dtype, pin_memory=self.device.type == "cuda")
        dst.copy_(src)  # warm-up (page faults, lazy allocation): not timed
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            dst.copy_(src)
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            times.append(time.perf_counter() - start)
        return num_bytes / max(min(times), 1e-9)

    def allocate_kv_cache(self, num_blocks: int) -> None:
        """Allocate ``num_blocks`` device blocks (zeroed: masked slots must never hold NaN)."""
        _, kv_heads = local_heads(self.spec, self.tp)
        shape = (self.spec.num_layers, 2, num_blocks, self.cfg.block_size, kv_heads, self.spec.head_dim)
        cache = torch.zeros(shape, dtype=self.dtype, device=self.device)
        self.kv_cache = [(cache[i, 0], cache[i, 1]) for i in range(self.spec.num_layers)]
        self._device_pool = cache
        num_swap_blocks = self.swap_pool_blocks()
        if num_swap_blocks > 0:
            host_shape = shape[:2] + (num_swap_blocks,) + shape[3:]
            pin = self.device.type == "cuda"
            # empty, not zeros: a host block is only read after a swap-out wrote all of it, and an
            # untouched CPU pool (the default is GiBs) then costs no memory
            self.host_cache = torch.empty(host_shape, dtype=self.dtype, pin_memory=pin)

    # ---- running a step -----------------------------------------------------------------
    @torch.inference_mode()
    def execute(self, batch: StepBatch) -> StepOutput:
        """Apply the batch's block copies, run the forward pass, sample; rank 0's samples count."""
        start = time.perf_counter()
        self._move_blocks(batch)
        if batch.num_tokens == 0:
            return StepOutput([], time.perf_counter() - start)
        dev = self.device
        meta = AttentionMetadata(
            slot_mapping=batch.slot_mapping.to(dev, non_blocking=True),
            block_tables=batch.block_tables.to(dev, non_blocking=True),
            cu_seqlens_q=batch.cu_seqlens_q.to(dev, non_blocking=True),
            context_lens=batch.context_lens.to(dev, non_blocking=True),
            max_query_len=batch.max_query_len,
            max_context_len=batch.max_context_len,
        )
        hidden = self.model(batch.input_ids.to(dev), batch.positions.to(dev), self.kv_cache, meta, self.ops)
        if batch.sample_rows.numel() == 0:
            return StepOutput([], time.perf_counter() - start)
        logits = self.model.compute_logits(hidden[batch.sample_rows.to(dev)])
        tokens = sample(logits, batch.sampling, batch.sample_seeds)
        return StepOutput(tokens, time.perf_counter() - start)

    def _move_blocks(self, batch: StepBatch) -> None:
        pool, host = self.__dict__.get("_device_pool"), self.host_cache
        for src, dst in batch.swap_out:
            host[:, :, dst].copy_(pool[:, :, src], non_blocking=True)
        for src, dst in batch.swap_in:
            pool[:, :, dst].copy_(host[:, :, src], non_blocking=True)
        for src, dst in batch.copy_blocks:
            pool[:, :, dst].copy_(pool[:, :, src])
        if batch.swap_out and self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


class Executor(ABC):
    """What the engine talks to. Implementations: :class:`LocalExecutor`, the TP executor, the
    simulator (``servelab.sim_executor``)."""

    spec: ModelSpec
    num_kv_blocks: int
    bytes_per_block: int
    num_swap_blocks: int = 0  # host swap pool (blocks) the swap copies of a plan may use

    @abstractmethod
    def execute(self, batch: StepBatch) -> StepOutput:
        """Run one step; return the sampled token for each of ``batch.sample_rows``, in order."""

    def run(self, plan, allocator, block_size: int, run_seed: int, work=None) -> StepOutput:
        """Run a plan: flatten it into a :class:`StepBatch` and :meth:`execute` it. An executor
        without tensors (the simulator) overrides this and never builds a batch; ``work`` is the
        plan's :class:`~servelab.step_work.StepWork` when the engine has counted it."""
        return self.execute(build_batch(plan, allocator, block_size, run_seed))

    def measure_swap_bandwidth(self) -> float:
        """Device <-> host copy bandwidth (bytes/s), measured with a real copy. Default: a host
        memory copy."""
        src = torch.rand(8 * 2**20)
        dst = torch.empty_like(src)
        dst.copy_(src)
        start = time.perf_counter()
        dst.copy_(src)
        return src.numel() * src.element_size() / max(time.perf_counter() - start, 1e-9)

    def shutdown(self) -> None:
        """Release workers and resources (idempotent)."""


class LocalExecutor(Executor):
    """One worker in this process."""

    def __init__(self, cfg: WorkerConfig) -> None:
        self.worker = ModelWorker(cfg)
        self.spec = self.worker.spec
        self.num_kv_blocks = self.worker.available_kv_blocks()
        self.bytes_per_block = self.worker.bytes_per_block()
        self.num_swap_blocks = self.worker.swap_pool_blocks()
        self.worker.allocate_kv_cache(self.num_kv_blocks)

    def execute(self, batch: StepBatch) -> StepOutput:
        return self.worker.execute(batch)

    def measure_swap_bandwidth(self) -> float:
        return self.worker.measure_swap_bandwidth()


def resolve_device(name: str) -> torch.device:
    """``auto`` is CUDA when available, else CPU."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError(f"backend.device={name!r} but CUDA is not available on this machine")
    return torch.device(name)
