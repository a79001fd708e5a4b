"""Built-in prefix-cache evictors (``evictor=<name>``)."""

from .lru import LruEvictor

BUILTIN = [LruEvictor]
