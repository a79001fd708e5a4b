"""Built-in schedulers."""

from .fcfs import FCFSScheduler
from .lpm import LPMScheduler
from .mlfq import MLFQScheduler
from .priority import PriorityScheduler
from .sjf import SJFScheduler
from .slo_aware import SLOAwareScheduler
from .static import StaticBatchScheduler
from .vtc import VTCScheduler

BUILTIN = [FCFSScheduler, StaticBatchScheduler, PriorityScheduler, SLOAwareScheduler, VTCScheduler, MLFQScheduler,
           SJFScheduler, LPMScheduler]
