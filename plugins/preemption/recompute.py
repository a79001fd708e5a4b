"""Recompute preemption: drop the victim's KV and recompute prompt + generated tokens later."""

from servelab.plugin_api import PreemptionDecision

from .victims import VictimRulePolicy


class RecomputePreemption(VictimRulePolicy):
    """Always recompute; the victim is chosen by ``preemption.victim`` (default: the last)."""

    name = "recompute"

    def decide(self, victim):
        return PreemptionDecision(victim.id, "recompute", "policy: always recompute")
