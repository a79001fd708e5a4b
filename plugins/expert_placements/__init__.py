"""Built-in expert placements (``expert_placement=<name>``): which rank holds each MoE expert."""

from .eplb import EplbPlacement
from .linear import LinearPlacement
from .round_robin import RoundRobinPlacement

BUILTIN = [LinearPlacement, RoundRobinPlacement, EplbPlacement]
