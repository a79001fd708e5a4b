"""What a model worker is built from: torch-free, so a simulated run composes its stack without loading torch."""

from __future__ import annotations

from dataclasses import dataclass


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
    draft_model_path: str | None = None  # drafter=draft_model: a second checkpoint run beside the target
    draft_scratch_blocks: int = 0  # draft KV blocks past the pool, for positions a draft runs ahead into
    quantization: str = "none"  # model.quantization: none | int8 (weight-only, the target model's decoder linears)
    kv_cache_dtype: str = "auto"  # auto | int8 | fp8_e4m3 (target and draft KV alike)
