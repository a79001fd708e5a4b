"""Model-free test doubles: a virtual clock and a fake executor with deterministic step times.

Policies cannot tell a :class:`FakeExecutor` from a real one, so scheduling and memory rules can
be tested on hand-made scenarios in milliseconds (also by plugin authors in their own tests).
"""

from __future__ import annotations

from dataclasses import dataclass

from .batch import StepBatch
from .executor import Executor, StepOutput
from .model.spec import ModelSpec


class VirtualClock:
    """A clock that only moves when told to; pass ``clock.sleep`` to ``run_workload``."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += max(0.0, seconds)

    sleep = advance


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
                 max_positions: int = 4096) -> None:
        self.clock = clock
        self.num_kv_blocks = num_kv_blocks
        self.bytes_per_block = bytes_per_block
        self.spec = fake_spec(vocab_size, max_positions)
        self.step_time = step_time or StepTimeModel()
        self.batches: list[StepBatch] = []

    def execute(self, batch: StepBatch) -> StepOutput:
        self.batches.append(batch)
        m = self.step_time
        seconds = m.base_s + m.per_token_s * batch.num_tokens + m.per_seq_s * (len(batch.cu_seqlens_q) - 1)
        self.clock.advance(seconds)
        rows = batch.sample_rows.tolist()
        ids, pos = batch.input_ids.tolist(), batch.positions.tolist()
        tokens = [(ids[r] * 31 + pos[r] * 17 + 7) % self.spec.vocab_size for r in rows]
        return StepOutput(tokens, seconds)
