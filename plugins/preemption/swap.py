"""Swap preemption: copy the victim's KV blocks to the host pool and bring them back later.

When the host pool cannot take the victim, fall back to recompute and say why (in the decision's
``reason`` and the log).
"""

from __future__ import annotations

import logging

from servelab.plugin_api import PreemptionDecision, PreemptionPolicy

from .victims import VictimRulePolicy

log = logging.getLogger(__name__)



def swap_fallback_reason(allocator, victim) -> str | None:
    """Why ``victim`` cannot be swapped out now (None if it can)."""
    if allocator.can_swap_out(victim):
        return None
    need = len(allocator.block_table(victim.id))
    if allocator.num_swap_blocks == 0:
        return "fallback to recompute: no host swap pool (backend.num_swap_blocks / swap_space_gb = 0)"
    if need > allocator.num_swap_blocks:
        return (f"fallback to recompute: the victim holds {need} blocks but the whole host swap pool has "
                f"{allocator.num_swap_blocks}")
    return f"fallback to recompute: host swap pool full (victim needs {need} blocks)"


def warn_without_pool(policy: PreemptionPolicy) -> None:
    if policy.allocator.num_swap_blocks == 0:
        log.warning("preemption=%s with a host swap pool of 0 blocks (backend.num_swap_blocks / swap_space_gb): "
                    "every preemption falls back to recompute; leave both null for the default pool", policy.name)


class SwapPreemption(VictimRulePolicy):
    """Swap whenever the host pool has room, else recompute."""

    name = "swap"
    uses_host_pool = True  # gets the default host pool (servelab.assemble.swap_pool) unless one is configured

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        warn_without_pool(self)

    def decide(self, victim):
        reason = swap_fallback_reason(self.allocator, victim)
        if reason:
            log.info("preempting %s: %s", victim.id, reason)
            return PreemptionDecision(victim.id, "recompute", reason)
        return PreemptionDecision(victim.id, "swap", "policy: swap while the host pool has room")
