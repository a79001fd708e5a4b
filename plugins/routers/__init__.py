"""Built-in routers (``router=<name>``): which replica of a cluster serves each request."""

from .least_outstanding import LeastOutstandingRouter
from .power_of_two import PowerOfTwoRouter
from .prefix_affinity import PrefixAffinityRouter
from .round_robin import RoundRobinRouter
from .session import SessionRouter

BUILTIN = [RoundRobinRouter, LeastOutstandingRouter, PowerOfTwoRouter, PrefixAffinityRouter, SessionRouter]
