"""Built-in preemption policies."""

from .recompute import RecomputePreemption

BUILTIN = [RecomputePreemption]
