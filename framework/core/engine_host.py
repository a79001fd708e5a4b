"""The host (CPU) side of an engine step as a model: what an engine preset (``engine=``) says its
engine spends outside the GPU kernels, and whether that work hides behind the GPU step.

A step of ``s`` sequences and ``t`` scheduled tokens costs the host

    per_step_s + per_seq_s x s + per_token_s x t

(scheduling, input preparation, sampling bookkeeping, output processing; each preset says which
component each term covers and where each figure comes from, docs/simulator.md "Engines"). With
``overlap`` (SGLang's overlap scheduler, vLLM's async scheduling) the host prepares the next step
while the GPU runs this one, so a step takes ``max(gpu, host)``; without it (vLLM before V1,
servelab's own engine) ``gpu + host``.

``source="time_model"`` keeps the time model's own host term (the measured host tables, or the
calibrated roofline's fit of them) and only applies ``overlap``. Torch-free, like all of
:mod:`servelab.core`; a time model reads it from its context
(:attr:`servelab.core.contexts.TimeModelContext.engine_host`).
"""

from __future__ import annotations

from dataclasses import dataclass

HOST_SOURCES = ("time_model", "engine")


@dataclass(frozen=True)
class EngineHost:
    """One engine's host time per step (seconds) and whether it overlaps the GPU step."""

    source: str = "time_model"  # time_model: the time model's host term; engine: the terms below
    per_step_s: float = 0.0
    per_seq_s: float = 0.0
    per_token_s: float = 0.0
    overlap: bool = False
    engine: str = "servelab"  # the engine preset it came from (for messages and summary.json)

    def __post_init__(self) -> None:
        if self.source not in HOST_SOURCES:
            raise ValueError(f"engine.host.source={self.source!r}: one of {', '.join(HOST_SOURCES)}")
        for key in ("per_step_s", "per_seq_s", "per_token_s"):
            if getattr(self, key) < 0:
                raise ValueError(f"engine.host.{key[:-2]}_us must be >= 0")

    @property
    def changes_pricing(self) -> bool:
        """False for the default (the time model's host, added to the GPU step): steps priced as before."""
        return self.source != "time_model" or self.overlap

    def seconds(self, num_seqs: int, num_tokens: int) -> float:
        """The engine's own host seconds of a step (``source="engine"``)."""
        if not num_seqs:
            return 0.0
        return self.per_step_s + self.per_seq_s * num_seqs + self.per_token_s * num_tokens

    def describe(self) -> dict[str, object]:
        """What ``summary.json`` records under ``engine.host``."""
        out: dict[str, object] = {"source": self.source, "overlap": self.overlap}
        if self.source == "engine":
            out.update(per_step_us=self.per_step_s * 1e6, per_seq_us=self.per_seq_s * 1e6,
                       per_token_us=self.per_token_s * 1e6)
        return out
