"""Built-in autoscalers (``autoscaler=<name>``): when a simulated cluster adds or retires a replica."""

from .none import NoAutoscaler
from .slo import SLOAutoscaler
from .threshold import ThresholdAutoscaler

BUILTIN = [NoAutoscaler, ThresholdAutoscaler, SLOAutoscaler]
