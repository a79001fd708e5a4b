"""Where a mixture-of-experts model's routed experts live over the expert-parallel ranks: the
``expert_placement`` plugin kind (``expert_placement=<name>``).

A placement is a *plan*: an integer array ``[moe_layers, expert_parallel_size, slots_per_rank]``
whose entry ``[l, r, j]`` is the expert held in slot ``j`` of rank (expert-parallel group) ``r`` in
MoE layer ``l``. Every rank has the same number of slots: the model's experts over the ranks plus,
for a placement that replicates hot experts, its :meth:`ExpertPlacement.redundant_experts` over the
ranks (the simulator's memory plan reserves their weights, so the KV pool shrinks by them). An
expert held in several slots (replicas) has its tokens split evenly over them.

The simulator (:mod:`servelab.sim.moe_placement`) asks :meth:`ExpertPlacement.place` for a plan
before the first step (``load=None``: nothing measured yet) and, when the plugin sets
``replan_every_steps``, again every that many steps with the tokens each expert received since the
previous plan (``load``: ``[moe_layers, num_experts]``); moving an expert's weights to a rank that
did not hold it is priced over the intra-node link and charged to that step.

Contracts (``servelab check-plugin expert_placement=<name>``, :mod:`servelab.kit.expert_placement_contracts`):
every expert on at least one rank in every layer, the plan's shape (the slots the memory plan
reserved, no more), ids in range, and the same plan for the same load (no hidden state, no clock).
No torch: a placement package imports this through ``servelab.plugin_api``.
"""

from __future__ import annotations

from abc import abstractmethod
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from servelab.core.errors import ConfigError
from servelab.core.interfaces import Plugin


@dataclass(frozen=True)
class ExpertPlacementContext:
    """What a placement is built for. ``slots_per_rank``: experts each rank holds, replicas included
    (``(num_experts + redundant_experts) / expert_parallel_size``). A dense model: all zero but ``ep``."""

    num_experts: int
    num_moe_layers: int
    expert_parallel_size: int
    slots_per_rank: int
    seed: int = 0

    @property
    def plan_shape(self) -> tuple[int, int, int]:
        return (self.num_moe_layers, self.expert_parallel_size, self.slots_per_rank)


class ExpertPlacement(Plugin):
    """Base of every expert placement: :meth:`place` returns a plan (module docstring)."""

    context_type: ClassVar[type | None] = ExpertPlacementContext
    #: re-plan every this many steps from the load measured since the last plan (0: placed once)
    replan_every_steps: int = 0
    #: the load of this many steps before a re-plan is what :meth:`place` sees (0: every step since the last plan)
    load_window_steps: int = 0

    def __init__(self, config: Any, context: ExpertPlacementContext) -> None:
        super().__init__(config, context)

    @classmethod
    def redundant_experts(cls, config: Any) -> int:
        """Slots beyond one per expert, over all ranks (a multiple of ``expert_parallel_size``); the
        memory plan reserves their weights before the KV pool is sized, so this reads only ``config``."""
        return 0

    @abstractmethod
    def place(self, load: np.ndarray | None) -> np.ndarray:
        """The plan for ``load`` (tokens each expert received, ``[moe_layers, num_experts]``; None
        before any step): ``[moe_layers, expert_parallel_size, slots_per_rank]`` expert ids."""


def linear_plan(context: ExpertPlacementContext) -> np.ndarray:
    """Expert ``e`` on rank ``e // (num_experts / ep)``: vLLM's and SGLang's default (no replicas)."""
    c = context
    if c.slots_per_rank * c.expert_parallel_size != c.num_experts:
        raise ConfigError(f"a placement without replicas holds {c.num_experts} experts, but the memory plan "
                          f"reserved {c.slots_per_rank} slots on each of {c.expert_parallel_size} ranks")
    return np.tile(np.arange(c.num_experts).reshape(1, c.expert_parallel_size, -1), (c.num_moe_layers, 1, 1))


def check_plan(plan: Any, context: ExpertPlacementContext, who: str) -> np.ndarray:
    """``plan`` as an int64 array, or a :class:`ConfigError` naming ``who`` and the broken rule (shape,
    ids in range, every expert placed in every layer)."""
    arr = np.asarray(plan)
    if arr.shape != context.plan_shape or not np.issubdtype(arr.dtype, np.integer):
        raise ConfigError(f"{who}: a plan is integer expert ids of shape [moe_layers, ep, slots_per_rank] = "
                          f"{list(context.plan_shape)}, got {list(arr.shape)} of {arr.dtype}")
    if arr.size and (arr.min() < 0 or arr.max() >= context.num_experts):
        raise ConfigError(f"{who}: expert ids must lie in [0, {context.num_experts}); found "
                          f"{int(arr.min())}..{int(arr.max())}")
    flat = arr.reshape(context.num_moe_layers, -1)
    for layer, row in enumerate(flat):
        missing = np.setdiff1d(np.arange(context.num_experts), row)
        if missing.size:
            raise ConfigError(f"{who}: MoE layer {layer} places no replica of expert(s) {missing[:8].tolist()}: "
                              "every expert must be on at least one rank")
    return arr.astype(np.int64)
