"""Built-in schedulers."""

from .fcfs import FCFSScheduler

BUILTIN = [FCFSScheduler]
