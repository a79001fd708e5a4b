"""Built-in preemption policies."""

from .adaptive import AdaptivePreemption
from .recompute import RecomputePreemption
from .swap import SwapPreemption

BUILTIN = [RecomputePreemption, SwapPreemption, AdaptivePreemption]
