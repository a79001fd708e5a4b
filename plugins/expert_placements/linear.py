"""``expert_placement=linear`` (the default): expert ``e`` on rank ``e // (num_experts / ep)``, the
contiguous split vLLM and SGLang use without a load balancer; placed once, no replicas."""

from __future__ import annotations

from servelab.plugin_api import ExpertPlacement, linear_plan


class LinearPlacement(ExpertPlacement):
    """Contiguous blocks of experts per rank."""

    name = "linear"

    def place(self, load):
        return linear_plan(self.context)
