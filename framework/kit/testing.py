"""Model-free test doubles: a virtual clock and a fake executor with deterministic step times.

Policies cannot tell a :class:`FakeExecutor` from a real one, so scheduling and memory rules can
be tested on hand-made scenarios in milliseconds (also by plugin authors in their own tests).
:func:`check_plugin` (the conformance kit, :mod:`servelab.kit.conformance`) runs a plugin through
the contracts every built-in passes.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import cast

from servelab.core.executor import Executor, StepOutput
from servelab.core.batch import StepBatch
from servelab.core.model_spec import ModelSpec
from servelab.exec.sampler import verify_row_tokens


class VirtualClock:
    """A clock that only moves when told to (the :class:`~servelab.engine.clock.Clock` protocol)."""

    def __init__(self) -> None:
        self.t = 0.0

    def now(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += max(0.0, seconds)

    sleep = advance

    def end_step(self, work) -> None:
        """The fake executor already advanced the clock."""

    def end_draft(self, draft) -> None:
        """Drafting takes no time here (a fake executor prices steps only)."""


@dataclass
class StepTimeModel:
    """``base_s + per_token_s * tokens + per_seq_s * sequences`` seconds per step."""

    base_s: float = 0.005
    per_token_s: float = 0.0002
    per_seq_s: float = 0.0005


def fake_spec(vocab_size: int = 1000, max_positions: int = 4096, eos_token_id: int | None = None) -> ModelSpec:
    return ModelSpec(architecture="Fake", family="fake", vocab_size=vocab_size, hidden_size=8, intermediate_size=8,
                     num_layers=1, num_heads=1, num_kv_heads=1, head_dim=8, rms_norm_eps=1e-6,
                     max_position_embeddings=max_positions, tie_word_embeddings=False, qkv_bias=False,
                     qk_norm=False, rope_type="default", rope_theta=1e4,
                     eos_token_ids=() if eos_token_id is None else (eos_token_id,))


class FakeExecutor(Executor):
    """Samples ``f(last token, position)`` (so outputs do not depend on batching or preemption)
    and advances ``clock`` by the step-time model instead of running a model."""

    def __init__(self, clock: VirtualClock, num_kv_blocks: int, vocab_size: int = 1000,
                 step_time: StepTimeModel | None = None, bytes_per_block: int = 4096,
                 max_positions: int = 4096, num_swap_blocks: int = 0,
                 swap_bytes_per_s: float = 1e9) -> None:
        self.clock = clock
        self.num_kv_blocks = num_kv_blocks
        self.num_swap_blocks = num_swap_blocks
        self.swap_bytes_per_s = swap_bytes_per_s
        self.bytes_per_block = bytes_per_block
        self.spec = fake_spec(vocab_size, max_positions)
        self.step_time = step_time or StepTimeModel()
        self.batches: list[StepBatch] = []

    def measure_swap_bandwidth(self) -> float:
        return self.swap_bytes_per_s

    def execute(self, batch: StepBatch) -> StepOutput:
        self.batches.append(batch)
        m = self.step_time
        seconds = m.base_s + m.per_token_s * batch.num_tokens + m.per_seq_s * (len(batch.cu_seqlens_q) - 1)
        self.clock.advance(seconds)
        rows = batch.sample_rows.tolist()
        ids, pos = batch.input_ids.tolist(), batch.positions.tolist()
        tokens = [(ids[r] * 31 + pos[r] * 17 + 7) % self.spec.vocab_size for r in rows]
        tokens, accepted = verify_row_tokens(tokens, batch)
        return StepOutput(tokens, seconds, accepted=accepted)


def copy_kv_blocks(pairs, src_kv: dict, dst_kv: dict, block_size: int) -> None:
    """Copy the fake KV of each ``(src_block, dst_block)`` (a swap, a block copy, a KV transfer)."""
    for src, dst in pairs:
        for i in range(block_size):
            value = src_kv.get(src * block_size + i)
            if value is None:
                dst_kv.pop(dst * block_size + i, None)
            else:
                dst_kv[dst * block_size + i] = value


class KVCheckingExecutor(FakeExecutor):
    """A :class:`FakeExecutor` that keeps a fake KV cache (``(token, position)`` per slot, and a
    host pool for swaps) and samples from what it *reads back* through the block tables.

    The sampled token is a function of every ``(token, position)`` read for the context, so a
    wrong block table, a block shared while still written, an evicted prefix block, or a lost
    swap copy changes the outputs (or raises when a slot holds the wrong position) — memory
    policies are checked end to end without a model.
    """

    def __init__(self, clock: VirtualClock, num_kv_blocks: int, block_size: int, **kwargs) -> None:
        super().__init__(clock, num_kv_blocks, **kwargs)
        self.block_size = block_size
        self.device_kv: dict[int, tuple[int, int]] = {}
        self.host_kv: dict[int, tuple[int, int]] = {}

    def _copy(self, pairs, src_kv, dst_kv) -> None:
        copy_kv_blocks(pairs, src_kv, dst_kv, self.block_size)

    def execute(self, batch: StepBatch) -> StepOutput:
        if batch.swap_out or batch.swap_in:
            if any(dst >= self.num_swap_blocks for _, dst in batch.swap_out):
                raise AssertionError(f"swap-out to a host block outside the pool of {self.num_swap_blocks}")
        self._copy(batch.swap_out, self.device_kv, self.host_kv)
        self._copy(batch.swap_in, self.host_kv, self.device_kv)
        self._copy(batch.copy_blocks, self.device_kv, self.device_kv)
        out = super().execute(batch)  # timing, and records the batch
        ids, pos, slots = batch.input_ids.tolist(), batch.positions.tolist(), batch.slot_mapping.tolist()
        for token, p, slot in zip(ids, pos, slots):
            if not 0 <= slot < self.num_kv_blocks * self.block_size:
                raise AssertionError(f"slot {slot} outside the pool")
            self.device_kv[slot] = (token, p)
        cu, tables = batch.cu_seqlens_q.tolist(), batch.block_tables.tolist()
        tokens = []
        for row in batch.sample_rows.tolist():
            table, ctx = tables[bisect.bisect_right(cu, row) - 1], pos[row] + 1
            read = [self.device_kv.get(table[q // self.block_size] * self.block_size + q % self.block_size)
                    for q in range(ctx)]
            bad = next((q for q, v in enumerate(read) if v is None or v[1] != q), None)
            if bad is not None:
                raise AssertionError(f"KV slot for position {bad} holds {read[bad]} (context of {ctx})")
            tokens.append(hash(tuple(t for t, _ in cast("list[tuple[int, int]]", read))) % self.spec.vocab_size)
        tokens, accepted = verify_row_tokens(tokens, batch)
        return StepOutput(tokens, out.model_s, accepted=accepted)


def __getattr__(name: str):
    """Deprecated: ``check_plugin`` and ``Report`` are :mod:`servelab.testing`'s (they live in
    :mod:`servelab.kit.conformance`). Looked up by name, not imported here: the conformance kit
    imports this module, and this module does not depend on it."""
    if name in ("check_plugin", "Report"):
        import importlib  # noqa: PLC0415 - deprecated
        import warnings  # noqa: PLC0415 - deprecated

        warnings.warn(f"servelab.kit.testing.{name} is deprecated: import it from servelab.testing",
                      DeprecationWarning, stacklevel=2)
        return getattr(importlib.import_module("servelab.kit.conformance"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
