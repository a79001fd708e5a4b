"""Built-in KV tier policies (``kv_tier_policy=<name>``): what goes below the GPU and what comes back."""

from .none import NoTierPolicy
from .reuse_aware import ReuseAwarePolicy
from .write_back import WriteBackPolicy
from .write_back_prefetch import WriteBackPrefetchPolicy
from .write_through import WriteThroughPolicy

BUILTIN = [NoTierPolicy, WriteBackPolicy, WriteThroughPolicy, ReuseAwarePolicy, WriteBackPrefetchPolicy]
