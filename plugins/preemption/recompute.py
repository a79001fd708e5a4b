"""Recompute preemption: drop the victim's KV and recompute prompt + generated tokens later."""

from dataclasses import dataclass

from servelab.interfaces import PreemptionDecision, PreemptionPolicy

from .victims import VictimRule, select_victim


@dataclass
class RecomputeConfig:
    victim: VictimRule = VictimRule.last


class RecomputePreemption(PreemptionPolicy):
    """Always recompute; the victim is chosen by ``preemption.victim`` (default: the last)."""

    name = "recompute"
    Config = RecomputeConfig

    def select_victim(self, candidates):
        return select_victim(self.config.victim, candidates, self.allocator)

    def decide(self, victim):
        return PreemptionDecision(victim.id, "recompute", "policy: always recompute")
