"""First come, first served: the unified loop with a FIFO waiting queue."""

from servelab.plugin_api import QueueScheduler


class FCFSScheduler(QueueScheduler):
    """Running sequences keep their arrival order; the newest running one is preempted first."""

    name = "fcfs"
