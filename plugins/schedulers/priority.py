"""Priority scheduling: lower ``priority`` = more urgent; ties go by arrival.

- The waiting queue is ordered by ``(priority, arrival)``.
- Running sequences get the step budget in the same order, so under memory pressure the least
  urgent (and, among equals, the newest) running sequence is preempted first.
- A waiting request may preempt a strictly less urgent running one, both for KV blocks and for a
  seat when ``max_num_seqs`` sequences run. Equal priorities never preempt each other.

There is no aging: a steady stream of urgent requests starves less urgent ones, as in vLLM's
priority policy.
"""

from servelab.scheduling import QueueScheduler


def urgency(seq) -> tuple[int, float]:
    """Sort key: most urgent first, then earliest arrival."""
    return seq.request.priority, seq.arrival_s


class PriorityScheduler(QueueScheduler):
    """(priority, arrival) order for admission, budget and preemption."""

    name = "priority"

    def waiting_key(self):
        return urgency

    def running_order(self, running, now):
        running.sort(key=urgency)  # nearly sorted step to step: Timsort is ~linear
        return running

    def may_preempt_for(self, seq, victim) -> bool:
        return victim.request.priority > seq.request.priority
