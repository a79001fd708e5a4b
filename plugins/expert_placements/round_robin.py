"""``expert_placement=round_robin``: expert ``e`` on rank ``e % ep`` (vLLM's
``--expert-placement-strategy round_robin``): neighbouring expert ids, which a trained router's hot
experts need not avoid, land on different ranks. Placed once, no replicas."""

from __future__ import annotations

import numpy as np

from servelab.plugin_api import ExpertPlacement, linear_plan


class RoundRobinPlacement(ExpertPlacement):
    """Rank ``r`` holds experts ``r, r + ep, r + 2 ep, ...``."""

    name = "round_robin"

    def place(self, load):
        c = self.context
        linear_plan(c)  # the same slot count as linear (no replicas): refused alike otherwise
        per_rank = np.arange(c.num_experts).reshape(-1, c.expert_parallel_size).T  # [ep, slots]
        return np.broadcast_to(per_rank, c.plan_shape).copy()
