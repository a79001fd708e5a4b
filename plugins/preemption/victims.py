"""Victim choice shared by the preemption policies (``preemption.victim=...``)."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Sequence as Seq

from servelab.plugin_api import BlockAllocator, PreemptionPolicy, Sequence


class VictimRule(enum.Enum):
    """Which running sequence is preempted first.

    - ``last``: the scheduler's last one (for FCFS the newest arrival; the default);
    - ``lowest_priority``: the largest ``priority`` value (smaller = more important, vLLM's
      convention);
    - ``most_blocks``: the one holding the most KV blocks (frees the most memory at once);
    - ``least_progress``: the one with the fewest generated tokens (loses the least work).
    Ties go to the later candidate in the scheduler's order.
    """

    last = "last"
    lowest_priority = "lowest_priority"
    most_blocks = "most_blocks"
    least_progress = "least_progress"


def select_victim(rule: VictimRule | str, candidates: Seq[Sequence], allocator: BlockAllocator) -> Sequence:
    """Pick one of ``candidates`` (non-empty, most important first) by ``rule``."""
    rule = VictimRule(getattr(rule, "value", rule))
    if rule is VictimRule.last:
        return candidates[-1]
    keys = {
        VictimRule.lowest_priority: lambda s: s.request.priority,
        VictimRule.most_blocks: lambda s: len(allocator.block_table(s.id)),
        VictimRule.least_progress: lambda s: -s.num_output_tokens,
    }[rule]
    # max() keeps the first maximum; scanning reversed makes ties go to the later candidate.
    return max(reversed(list(candidates)), key=keys)


@dataclass
class VictimConfig:
    """The config every built-in preemption policy shares."""

    victim: VictimRule = VictimRule.last


class VictimRulePolicy(PreemptionPolicy):
    """A preemption policy whose victim is picked by ``preemption.victim``."""

    Config = VictimConfig

    def select_victim(self, candidates: Seq[Sequence]) -> Sequence:
        return select_victim(self.config.victim, candidates, self.allocator)
