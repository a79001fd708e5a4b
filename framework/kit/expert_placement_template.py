"""The ``servelab new-plugin expert_placement <name>`` skeleton (named by the kinds table)."""

from __future__ import annotations

from string import Template

from servelab.kit.plugin_templates import _HEAD

TEMPLATE = Template(_HEAD + '''\
import numpy as np

from servelab.plugin_api import ConfigError, ExpertPlacement


@dataclass
class ${Class}Config:
    num_redundant_experts: int = 0  # extra replicas over all ranks (a multiple of expert_parallel_size)
    step_interval: int = 0  # re-plan every this many steps from the measured load (0: placed once)


class $Class(ExpertPlacement):
    """Hot experts first: sort a layer's experts by measured load and deal them to the ranks in a
    snake (0, 1, ..., ep-1, ep-1, ..., 0), the hottest replicated into the redundant slots. Change
    :meth:`place` to make it your placement; run with ``backend=sim model=qwen3_30b_a3b
    tensor_parallel_size=8 expert_parallel_size=8 sim.moe.routing_skew=1.2 expert_placement=$name``."""

    name = "$name"
    Config = ${Class}Config

    def __init__(self, config, context):
        super().__init__(config, context)
        if config.num_redundant_experts % context.expert_parallel_size:
            raise ConfigError(f"expert_placement.num_redundant_experts={config.num_redundant_experts} must be a "
                              f"multiple of expert_parallel_size={context.expert_parallel_size}")
        self.replan_every_steps = config.step_interval

    @classmethod
    def redundant_experts(cls, config):
        return config.num_redundant_experts  # the memory plan reserves their weights before the KV pool

    def place(self, load):
        c = self.context  # num_experts, num_moe_layers, expert_parallel_size, slots_per_rank
        ep, slots = c.expert_parallel_size, c.slots_per_rank
        load = np.zeros((c.num_moe_layers, c.num_experts)) if load is None else np.asarray(load, dtype=float)
        snake = np.concatenate([np.arange(ep), np.arange(ep)[::-1]])
        plan = np.empty(c.plan_shape, dtype=np.int64)
        for layer in range(c.num_moe_layers):
            hot = np.argsort(-load[layer], kind="stable")
            replicas = np.concatenate([hot, hot[: slots * ep - c.num_experts]])  # every expert, then the hottest again
            filled = np.zeros(ep, dtype=np.int64)
            for i, expert in enumerate(replicas):
                rank = snake[i % len(snake)]
                plan[layer, rank, filled[rank]] = expert
                filled[rank] += 1
        return plan  # [moe_layers, ep, slots_per_rank]: every expert at least once


@hookimpl
def servelab_register_expert_placements():
    return [$Class]
''')
