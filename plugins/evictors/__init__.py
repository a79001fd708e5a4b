"""Built-in prefix-cache evictors (``evictor=<name>``)."""

from .arc import ArcEvictor
from .cost_aware import CostAwareEvictor
from .lfu import LfuEvictor
from .lru import LruEvictor

BUILTIN = [LruEvictor, LfuEvictor, ArcEvictor, CostAwareEvictor]
