"""Built-in expert caches (``expert_cache=<name>``): which routed experts stay on the GPU when the rest
are offloaded to host memory (``sim.moe.expert_cache_slots`` per rank and MoE layer)."""

from .lfu import LfuExpertCache
from .lru import LruExpertCache
from .none import NoExpertCache
from .prefetch import PrefetchExpertCache

BUILTIN = [NoExpertCache, LruExpertCache, LfuExpertCache, PrefetchExpertCache]
