"""Adaptive preemption: per victim, swap or recompute, whichever the cost estimates say is cheaper.

swap cost      = 2 x (victim's KV blocks x bytes per block) / host-link bandwidth (out, then in);
                 the bandwidth is measured at start-up with a real copy, or ``backend.swap_bandwidth_gb_s``;
recompute cost = the step-time cost model's time to recompute the victim's computed tokens.
Each decision records both estimates (``PreemptionDecision.estimates``).
"""

from __future__ import annotations

import logging

from servelab.plugin_api import PreemptionDecision

from .swap import SwapPreemption, swap_fallback_reason

log = logging.getLogger(__name__)


class AdaptivePreemption(SwapPreemption):
    """Pick the cheaper of swap and recompute for each victim.

    The host pool (``uses_host_pool``, the warning when it is empty) is set up as for ``swap``.
    """

    name = "adaptive"

    def estimates(self, victim) -> dict[str, float]:
        """``{"swap_s": ..., "recompute_s": ...}`` for ``victim`` now."""
        blocks = len(self.allocator.block_table(victim.id))
        swap_s = 2 * self.cost_model.swap_seconds(blocks) if self.cost_model.swap_bytes_per_s else float("inf")
        return {"swap_s": swap_s, "recompute_s": self.cost_model.recompute_seconds(victim.num_computed_tokens),
                "blocks": float(blocks), "tokens": float(victim.num_computed_tokens)}

    def decide(self, victim):
        est = self.estimates(victim)
        if est["recompute_s"] <= est["swap_s"]:
            return PreemptionDecision(victim.id, "recompute", "cost: recompute <= swap", est)
        reason = swap_fallback_reason(self.allocator, victim)
        if reason:
            log.info("preempting %s: swap would be cheaper, but %s", victim.id, reason)
            return PreemptionDecision(victim.id, "recompute", f"cost: swap < recompute, but {reason}", est)
        return PreemptionDecision(victim.id, "swap", "cost: swap < recompute", est)
