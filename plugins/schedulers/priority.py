"""Priority scheduling: lower ``priority`` = more urgent; ties go by arrival.

- The waiting queue is ordered by ``(priority, arrival)``.
- Running sequences get the step budget in the same order, so under memory pressure the least
  urgent (and, among equals, the newest) running sequence is preempted first.
- A waiting request may preempt a strictly less urgent running one, both for KV blocks and for a
  seat when ``max_num_seqs`` sequences run. Equal priorities never preempt each other.

Without aging (``scheduler.aging_s=null``, the default) a steady stream of urgent requests
starves less urgent ones, as in vLLM's priority policy. With ``scheduler.aging_s=A`` a request's
*effective* priority improves by one level for every ``A`` seconds since its arrival (on the
scheduler's clock), and every rule above uses the effective priority: a request waits at most
behind the requests that arrived less than ``(its priority - theirs) * A`` seconds after it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from servelab.plugin_api import EVERY_STEP, UNTIL_ARRIVAL, ConfigError, NextDecision, QueueScheduler


def urgency(seq) -> tuple[int, float]:
    """Sort key: most urgent first, then earliest arrival."""
    return seq.request.priority, seq.arrival_s


@dataclass
class PriorityConfig:
    aging_s: float | None = None  # one priority level gained per aging_s seconds of age; null = no aging


class PriorityScheduler(QueueScheduler):
    """(priority, arrival) order for admission, budget and preemption; optionally aged."""

    name = "priority"
    Config = PriorityConfig

    def __init__(self, config, *args, **kwargs) -> None:
        if config.aging_s is not None and not config.aging_s > 0:
            raise ConfigError(f"scheduler.aging_s={config.aging_s} must be > 0 (or null: no aging)")
        super().__init__(config, *args, **kwargs)

    @property
    def time_dependent_key(self) -> bool:
        return self.config.aging_s is not None

    def effective_priority(self, seq, now: float) -> int:
        """``seq``'s priority at ``now``: one level better per ``aging_s`` seconds of age."""
        if self.config.aging_s is None:
            return seq.request.priority
        return seq.request.priority - math.floor(max(0.0, now - seq.arrival_s) / self.config.aging_s)

    def waiting_key(self):
        if self.config.aging_s is None:
            return urgency
        return lambda seq, now: (self.effective_priority(seq, now), seq.arrival_s)

    def running_order(self, running, now):
        if self.config.aging_s is None:
            running.sort(key=urgency)  # nearly sorted step to step: Timsort is ~linear
        else:
            running.sort(key=lambda seq: (self.effective_priority(seq, now), seq.arrival_s))
        return running

    def next_decision(self, now: float) -> NextDecision:
        # without aging the running order is fixed; with it a running sequence's level changes with time
        return UNTIL_ARRIVAL if self.config.aging_s is None and self.running_sorted_by(urgency) else EVERY_STEP

    def may_preempt_for(self, seq, victim) -> bool:
        return self.effective_priority(victim, self.now) > self.effective_priority(seq, self.now)
