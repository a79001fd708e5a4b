"""First come, first served: the unified loop with a FIFO waiting queue."""

from servelab.plugin_api import UNTIL_ARRIVAL, NextDecision, QueueScheduler


class FCFSScheduler(QueueScheduler):
    """Running sequences keep their arrival order; the newest running one is preempted first."""

    name = "fcfs"

    def next_decision(self, now: float) -> NextDecision:
        return UNTIL_ARRIVAL  # the running order is the arrival order; only an arrival is news

    def arrivals_beside_decodes(self) -> bool:
        return True  # running sequences decode first, in arrival order; nobody is preempted for a waiting one
