"""``expert_placement=eplb``: DeepSeek's expert-parallel load balancer (EPLB), re-planned from measured load.

DeepSeek-V3 (arXiv:2412.19437, section 3.4) serves hot experts from *redundant* copies: the load each
expert received over a recent window decides which experts get extra replicas and how every replica
is packed onto the ranks. The algorithm is the global policy of github.com/deepseek-ai/EPLB
(``eplb.py``, used by vLLM and SGLang when the expert groups do not divide over nodes; this simulator's
EP is one node):

1. **Replicate**: start with one replica per expert; ``num_redundant_experts`` times, give one more
   replica to the expert whose load per replica is highest.
2. **Pack**: every replica weighs its expert's load over its replica count; take them heaviest first
   and put each on the rank with the least weight so far that still has a free slot (every rank
   holds ``(num_experts + num_redundant_experts) / ep`` slots).

Before any step there is no measured load: the first plan packs uniform weights (the redundant
replicas go to experts 0, 1, ...). Settings as vLLM's ``EPLBConfig`` (docs.vllm.ai, ``vllm.config.parallel``):
re-plan every ``step_interval`` steps from the tokens of the last ``window_size`` steps. Moving a
replica to a rank that did not hold it is priced by the simulator over the intra-node link
(:mod:`servelab.sim.moe_placement`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from servelab.plugin_api import ConfigError, ExpertPlacement


@dataclass
class EplbConfig:
    num_redundant_experts: int = 0  # replicas beyond one per expert, over all ranks (a multiple of ep)
    step_interval: int = 3000  # re-plan every this many steps (vLLM's default); 0: plan once, from no load
    window_size: int = 1000  # the load of this many steps before a re-plan decides it (vLLM's default)


class EplbPlacement(ExpertPlacement):
    """Replicate the experts with the most load per replica, then pack replicas heaviest first."""

    name = "eplb"
    Config = EplbConfig

    def __init__(self, config: EplbConfig, context) -> None:
        super().__init__(config, context)
        for key in ("num_redundant_experts", "step_interval", "window_size"):
            if getattr(config, key) < 0:
                raise ConfigError(f"expert_placement.{key}={getattr(config, key)} must be >= 0")
        if config.num_redundant_experts % context.expert_parallel_size:
            raise ConfigError(f"expert_placement.num_redundant_experts={config.num_redundant_experts} must be a "
                              f"multiple of expert_parallel_size={context.expert_parallel_size} (every rank the "
                              "same slots)")
        self.replan_every_steps = config.step_interval
        self.load_window_steps = config.window_size

    @classmethod
    def redundant_experts(cls, config: EplbConfig) -> int:
        return config.num_redundant_experts

    def place(self, load):
        c = self.context
        weight = np.ones((c.num_moe_layers, c.num_experts)) if load is None else np.asarray(load, dtype=float)
        replica_of = replicate(weight, c.slots_per_rank * c.expert_parallel_size)
        counts = np.take_along_axis(_replica_counts(replica_of, c.num_experts), replica_of, axis=1)
        rank = balanced_packing(np.take_along_axis(weight, replica_of, axis=1) / counts, c.expert_parallel_size)
        by_rank = np.argsort(rank, axis=1, kind="stable")  # a rank's replicas in slot order
        return np.take_along_axis(replica_of, by_rank, axis=1).reshape(c.plan_shape)


def replicate(weight: np.ndarray, num_replicas: int) -> np.ndarray:
    """``[layers, num_replicas]``: the expert of each replica; the first ``num_experts`` are the experts
    themselves, each further one the expert with the highest load per replica at that point."""
    layers, experts = weight.shape
    replica_of = np.tile(np.arange(num_replicas), (layers, 1))
    count = np.ones((layers, experts))
    rows = np.arange(layers)
    for i in range(experts, num_replicas):
        hottest = (weight / count).argmax(axis=1)
        replica_of[:, i] = hottest
        count[rows, hottest] += 1
    return replica_of


def balanced_packing(weight: np.ndarray, packs: int) -> np.ndarray:
    """``[layers, items]`` -> each item's pack: heaviest first, each to the lightest pack with room
    (``items / packs`` per pack)."""
    layers, items = weight.shape
    per_pack = items // packs
    order = np.argsort(-weight, axis=1, kind="stable")
    load = np.zeros((layers, packs))
    filled = np.zeros((layers, packs), dtype=np.int64)
    pack_of = np.empty((layers, items), dtype=np.int64)
    rows = np.arange(layers)
    for j in range(items):
        item = order[:, j]
        pack = np.where(filled < per_pack, load, np.inf).argmin(axis=1)
        pack_of[rows, item] = pack
        load[rows, pack] += weight[rows, item]
        filled[rows, pack] += 1
    return pack_of


def _replica_counts(replica_of: np.ndarray, num_experts: int) -> np.ndarray:
    """``[layers, num_experts]``: replicas of each expert."""
    layers = replica_of.shape[0]
    flat = (replica_of + np.arange(layers)[:, None] * num_experts).ravel()
    return np.bincount(flat, minlength=layers * num_experts).reshape(layers, num_experts)
