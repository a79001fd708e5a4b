"""Built-in schedulers."""

from .fcfs import FCFSScheduler
from .priority import PriorityScheduler
from .slo_aware import SLOAwareScheduler
from .static import StaticBatchScheduler

BUILTIN = [FCFSScheduler, StaticBatchScheduler, PriorityScheduler, SLOAwareScheduler]
