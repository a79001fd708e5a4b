"""What the built-in drafters share: ``k`` (drafts per step, an upper bound) and a load switch."""

from __future__ import annotations

from dataclasses import dataclass

from servelab.plugin_api import MAX_DRAFT_TOKENS as MAX_DRAFTS, ConfigError, SpeculativeDrafter


@dataclass
class DrafterConfig:
    k: int = 4  # drafts per sequence per step (upper bound; fewer near the end of a request)
    disable_above_seqs: int = 0  # draft nothing in a step with more decode sequences than this (0 = always draft)


class BuiltinDrafter(SpeculativeDrafter):
    """Validates ``drafter.k`` and ``drafter.disable_above_seqs``; drafts for at most that many sequences."""

    def __init__(self, config, context) -> None:
        super().__init__(config, context)
        if not 1 <= config.k <= MAX_DRAFTS:
            raise ConfigError(f"drafter.k={config.k} must be between 1 and {MAX_DRAFTS}")
        if config.disable_above_seqs < 0:
            raise ConfigError(f"drafter.disable_above_seqs={config.disable_above_seqs} must be >= 0 (0 = never disable)")

    @property
    def num_speculative_tokens(self) -> int:
        return self.config.k

    def disabled_for(self, num_seqs: int) -> bool:
        """Under heavy load verification costs more than it saves (vLLM's speculative_disable_by_batch_size)."""
        return 0 < self.config.disable_above_seqs < num_seqs
