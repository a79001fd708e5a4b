"""The executor boundary: it owns the model weights and the KV tensors and runs a :class:`StepBatch`.

:class:`ModelWorker` is one rank's model + KV cache (used as is in one process, and by every
rank of tensor parallelism); :class:`LocalExecutor` runs one worker in this process. Policies
never see which executor runs.
"""

from __future__ import annotations

import contextlib
import time

import numpy as np
import torch

from servelab.core.contexts import ExecutorContext
from servelab.exec.worker_config import WorkerConfig
from servelab.core.executor import BackendConfig, Executor, StepOutput
from servelab.core.shapes import ModelShape
from servelab.core.batch import StepBatch
from servelab.kernels import select_attention_backend
from servelab.exec.model.layers import TPGroup
from servelab.exec.model.llama import AttentionMetadata, CausalLM, local_heads
from servelab.exec.model.loader import load_model
from servelab.core.model_spec import ModelSpec
from servelab.core.errors import ConfigError
from servelab.engine.drafting import DraftBatch, draft_tables, scratch_blocks_per_seq
from servelab.core.interfaces import Drafts
from servelab.exec.kv_pool import KVPool, bytes_per_block as kv_bytes_per_block
from servelab.exec.quant import kv_cache_storage_dtype, linear_kernel, quantize_model
from servelab.exec.sampler import sample_and_verify, sample_from, seeded_uniforms, target_probs_batch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


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
        self.kv_dtype = kv_cache_storage_dtype(cfg.kv_cache_dtype, self.dtype, self.device, self.ops.name)
        self.kv_quantized = cfg.kv_cache_dtype != "auto"
        # INT8 on a GPU: load and quantise in host memory, so the device never holds the full-precision shard
        load_device = torch.device("cpu") if cfg.quantization != "none" else self.device
        self.model = load_model(cfg.model_path, self.tp, self.dtype, load_device, cfg.max_model_len)
        self.spec: ModelSpec = self.model.spec
        if cfg.quantization != "none":  # the kernel choice is logged: only a run that quantises may state it
            quantize_model(self.model, cfg.quantization, linear_kernel(self.ops.name, self.device, self.dtype),
                           collective_device=self.device)
        self.model.to(self.device)
        if self.ops.name == "triton":
            from servelab.kernels.triton_ops import check_supported  # noqa: PLC0415 - triton

            try:
                check_supported(self.spec.head_dim, cfg.block_size)
            except ValueError as exc:
                raise ConfigError(f"attention_backend=triton: {exc}") from None
        self.kv_cache: list[tuple[torch.Tensor, ...]] = []
        self.device_pool: KVPool | None = None
        self.host_pool: KVPool | None = None
        self.draft_model: CausalLM | None = None
        self.draft_pool: KVPool | None = None
        self.draft_host_pool: KVPool | None = None
        self.num_pool_blocks: int  # the target's blocks, set with the draft model's pool (allocate_kv_cache)
        self.draft_kv_cache: list[tuple[torch.Tensor, ...]] = []
        if cfg.draft_model_path is not None:
            self._load_draft_model(cfg.draft_model_path)

    def _load_draft_model(self, path: str) -> None:
        draft = load_model(path, TPGroup(), self.dtype, self.device, self.cfg.max_model_len)
        if draft.spec.vocab_size != self.spec.vocab_size:
            raise ConfigError(f"drafter=draft_model: the draft model {path!r} has a vocabulary of "
                              f"{draft.spec.vocab_size} tokens but the target model has {self.spec.vocab_size}")
        self.draft_model = draft

    # ---- memory -------------------------------------------------------------------------
    def bytes_per_block(self) -> int:
        """One KV block of this rank, the draft model's share included (it uses the same tables)."""
        return self._target_bytes_per_block() + self._draft_bytes_per_block()

    def _target_bytes_per_block(self) -> int:
        _, kv_heads = local_heads(self.spec, self.tp)
        return kv_bytes_per_block(self.spec.num_layers, self.cfg.block_size, kv_heads, self.spec.head_dim,
                                  self.kv_dtype, self.kv_quantized)

    def _draft_bytes_per_block(self) -> int:
        if self.draft_model is None:
            return 0
        spec = self.draft_model.spec
        return kv_bytes_per_block(spec.num_layers, self.cfg.block_size, spec.num_kv_heads, spec.head_dim,
                                  self.kv_dtype, self.kv_quantized)

    def available_kv_blocks(self) -> int:
        """Blocks this rank could hold: ``num_kv_blocks`` if set, else from the memory budget."""
        if self.cfg.num_kv_blocks is not None:
            return self.cfg.num_kv_blocks
        if self.device.type == "cuda":
            free, total = torch.cuda.mem_get_info(self.device)
            budget = free - (1 - self.cfg.gpu_memory_utilization) * total
        else:
            budget = self.cfg.kv_cache_memory_gb * 2**30
        budget -= self.cfg.draft_scratch_blocks * self._draft_bytes_per_block()
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
        layout = (self.cfg.block_size, kv_heads, self.spec.head_dim, self.kv_dtype, self.kv_quantized)
        self.device_pool = KVPool(self.spec.num_layers, num_blocks, *layout, device=self.device)
        self.kv_cache = self.device_pool.layers()
        num_swap_blocks = self.swap_pool_blocks()
        pin = self.device.type == "cuda"
        if num_swap_blocks > 0:
            self.host_pool = KVPool(self.spec.num_layers, num_swap_blocks, *layout, host=True, pin=pin)
        if self.draft_model is not None:
            d = self.draft_model.spec
            layout = (self.cfg.block_size, d.num_kv_heads, d.head_dim, self.kv_dtype, self.kv_quantized)
            self.draft_pool = KVPool(d.num_layers, num_blocks + self.cfg.draft_scratch_blocks, *layout,
                                     device=self.device)
            self.draft_kv_cache = self.draft_pool.layers()
            self.num_pool_blocks = num_blocks
            if num_swap_blocks > 0:
                self.draft_host_pool = KVPool(d.num_layers, num_swap_blocks, *layout, host=True, pin=pin)

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
            slot_mapping=_to(batch.slot_mapping, dev),
            block_tables=_to(batch.block_tables, dev),
            cu_seqlens_q=_to(batch.cu_seqlens_q, dev),
            context_lens=_to(batch.context_lens, dev),
            max_query_len=batch.max_query_len,
            max_context_len=batch.max_context_len,
        )
        input_ids, positions = _to(batch.input_ids, dev), _to(batch.positions, dev)
        hidden = self.model(input_ids, positions, self.kv_cache, meta, self.ops)
        if self.draft_model is not None:  # the mirror pass: draft KV wherever the target's is written
            self.draft_model(input_ids, positions, self.draft_kv_cache, meta, self.ops)
        if batch.num_sampled == 0:
            return StepOutput([], time.perf_counter() - start)
        logits = self.model.compute_logits(hidden[_to(batch.sample_rows, dev)])
        tokens, accepted = sample_and_verify(logits, batch)
        return StepOutput(tokens, time.perf_counter() - start, accepted=accepted)

    @torch.inference_mode()
    def draft(self, batch: DraftBatch) -> Drafts:
        """``batch.k`` draft tokens per sequence from the draft model, one batched step per draft."""
        per_seq = scratch_blocks_per_seq(batch.k, self.cfg.block_size)
        room = max(1, self.cfg.draft_scratch_blocks // per_seq)
        if len(batch.positions) > room:  # more sequences than scratch: draft them in slices
            parts = [self.draft(_slice(batch, i, i + room)) for i in range(0, len(batch.positions), room)]
            return Drafts([t for p in parts for t in p.token_ids], [q for p in parts for q in p.probs])
        dev, bs, n = self.device, self.cfg.block_size, len(batch.positions)
        tables = torch.from_numpy(draft_tables(batch, bs, self.num_pool_blocks, per_seq)).to(dev)
        rows = torch.arange(n, device=dev)
        tokens = torch.tensor(batch.last_token_ids, dtype=torch.long, device=dev)
        base = torch.tensor(batch.positions, dtype=torch.long, device=dev)
        drafted: list[list[int]] = []
        probs: list[list[torch.Tensor]] = [[] for _ in range(n)]
        sampled_params = [(i, params) for i, params in enumerate(batch.sampling) if params is not None]
        sampled = [i for i, _ in sampled_params]
        sampled_rows = torch.tensor(sampled, dtype=torch.long, device=dev)
        model = self.draft_model
        assert model is not None, "draft() needs drafter=draft_model's model"
        for j in range(batch.k):
            pos = base + j
            meta = AttentionMetadata(
                slot_mapping=tables[rows, pos // bs] * bs + pos % bs, block_tables=tables.to(torch.int32),
                cu_seqlens_q=torch.arange(n + 1, dtype=torch.int32, device=dev), context_lens=(pos + 1).to(torch.int32),
                max_query_len=1, max_context_len=max(batch.positions) + j + 1)
            logits = model.compute_logits(model(tokens, pos, self.draft_kv_cache, meta, self.ops))
            choice = logits.argmax(dim=-1).tolist()
            if sampled:  # drawn from the draft's distribution, which travels with the drafts
                q = target_probs_batch(logits[sampled_rows], [params for _, params in sampled_params])
                drawn = sample_from(q, seeded_uniforms(np.array([batch.seeds[i][j] for i in sampled], dtype=np.uint64), 1))
                for n, (i, token) in enumerate(zip(sampled, drawn)):
                    choice[i] = token
                    probs[i].append(q[n])
            drafted.append(choice)
            tokens = torch.tensor(choice, dtype=torch.long, device=dev)
        token_ids = [list(col) for col in zip(*drafted)]
        return Drafts(token_ids, [torch.stack(p) if p else None for p in probs])

    def _move_blocks(self, batch: StepBatch) -> None:
        pairs = [(self.device_pool, self.host_pool)]
        if self.draft_model is not None:
            pairs.append((self.draft_pool, self.draft_host_pool))
        for pool, host in pairs:
            assert pool is not None, "allocate_kv_cache() first"
            if batch.swap_out or batch.swap_in:
                assert host is not None, "swapping needs a host pool (backend.num_swap_blocks)"
                if batch.swap_out:
                    host.copy_blocks(pool, batch.swap_out, non_blocking=True)
                if batch.swap_in:
                    pool.copy_blocks(host, batch.swap_in, non_blocking=True)
            if batch.copy_blocks:
                pool.copy_blocks(pool, batch.copy_blocks)
        if batch.swap_out and self.device.type == "cuda":
            torch.cuda.synchronize(self.device)


def _to(array, device: torch.device) -> torch.Tensor:
    """A batch array (numpy from the engine, or a tensor) on ``device``, without a host copy."""
    return torch.as_tensor(array).to(device, non_blocking=True)


def _slice(batch: DraftBatch, start: int, stop: int) -> DraftBatch:
    return DraftBatch(batch.last_token_ids[start:stop], batch.positions[start:stop], batch.block_tables[start:stop],
                      batch.sampling[start:stop], batch.seeds[start:stop], batch.k)


class LocalExecutor(Executor):
    """``backend=local``: one worker in this process (``context.worker`` says what it loads)."""

    name = "local"

    def __init__(self, config: BackendConfig, context: ExecutorContext) -> None:
        super().__init__(config, context)
        if context.tensor_parallel_size > 1:
            raise ConfigError(f"backend=local runs one process: tensor_parallel_size={context.tensor_parallel_size} "
                              "needs backend=tp (or backend=torch, which picks it)")
        self.worker = ModelWorker(context.worker)
        self.spec = self.worker.spec
        self.num_kv_blocks = self.worker.available_kv_blocks()
        self.bytes_per_block = self.worker.bytes_per_block()
        self.num_swap_blocks = self.worker.swap_pool_blocks()
        self.worker.allocate_kv_cache(self.num_kv_blocks)
        self.resources = contextlib.ExitStack()  # what lives beside the pool (KV tier pools): closed at shutdown

    @property
    def kv_pool(self) -> KVPool | None:
        return self.worker.device_pool

    def execute(self, batch: StepBatch) -> StepOutput:
        return self.worker.execute(batch)

    def shutdown(self) -> None:
        self.resources.close()

    def draft(self, batch: DraftBatch) -> Drafts:
        if self.worker.draft_model is None:
            return super().draft(batch)
        return self.worker.draft(batch)

    def measure_swap_bandwidth(self) -> float:
        return self.worker.measure_swap_bandwidth()

    @property
    def draft_shape(self) -> ModelShape | None:
        draft = self.worker.draft_model
        return ModelShape.from_spec(draft.spec) if draft is not None else None

    def describe(self) -> dict[str, str]:
        return {"device": str(self.worker.device), "attention": self.worker.ops.name}


def resolve_device(name: str) -> torch.device:
    """``auto`` is CUDA when available, else CPU."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"backend.device={name} but CUDA is not available on this machine: use backend.device=cpu")
    return torch.device(name)
