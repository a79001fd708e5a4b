"""Recompute preemption: drop the victim's KV and recompute prompt + generated tokens later."""

from servelab.interfaces import PreemptionDecision, PreemptionPolicy


class RecomputePreemption(PreemptionPolicy):
    """Always recompute; the victim is the scheduler's last running sequence."""

    name = "recompute"

    def decide(self, victim):
        return PreemptionDecision(victim.id, "recompute", "policy: always recompute")
