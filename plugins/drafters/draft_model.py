"""Draft-model speculation (``drafter=draft_model``): a second, smaller checkpoint with the same
vocabulary proposes ``k`` tokens per sequence, batched across sequences.

The executor loads it beside the target (on rank 0 only under tensor parallelism: drafting is
rank 0's business and the target's ranks need nothing from it) and keeps its KV consistent
with what was verified (see :mod:`servelab.engine.drafting`). For sampled requests the drafts are drawn
from the draft model's distribution under the request's own temperature / top-k / top-p, and
that distribution travels with them so rejection sampling stays exact.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from servelab.plugin_api import PACKAGED_CHECKPOINTS, ConfigError, build_draft_batch

from .common import BuiltinDrafter, DrafterConfig


@dataclass
class DraftModelConfig(DrafterConfig):
    path: Optional[str] = None  # draft checkpoint dir; default: the shipped draft model for model=tiny_code


class DraftModelDrafter(BuiltinDrafter):
    """A small LM drafts; the target verifies (Leviathan et al. 2023, Chen et al. 2023)."""

    name = "draft_model"
    Config = DraftModelConfig
    runs_model = True

    @classmethod
    def model_path(cls, config, target_path):
        if config.path is not None:
            if not Path(config.path).is_dir():
                raise ConfigError(f"drafter.path={config.path!r} is not a checkpoint directory")
            return str(config.path)
        if target_path is not None and Path(target_path).resolve() == (PACKAGED_CHECKPOINTS / "tiny_code").resolve():
            return str(PACKAGED_CHECKPOINTS / "tiny_code_draft")
        raise ConfigError("drafter=draft_model needs drafter.path=<draft checkpoint dir> (it defaults to the "
                          "shipped draft model only when the target is model=tiny_code)")

    def propose(self, seqs, k):
        if not seqs or self.disabled_for(len(seqs)):
            return [[] for _ in seqs]
        draft = getattr(self.executor, "draft", None)
        if draft is None:
            raise RuntimeError(f"executor {type(self.executor).__name__} cannot run a draft model")
        return draft(build_draft_batch(seqs, self.allocator, k, self.seed))
