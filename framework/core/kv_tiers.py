"""KV cache tiers below the GPU pool (host memory, disk) and the plugin kind that runs them.

A tier is a store of KV blocks keyed by their prefix digest (the paged allocator's chained
:func:`block_digest`: equal digests mean equal prefixes), with a capacity in blocks and a link
to the GPU priced by bytes (``read_gb_s`` / ``write_gb_s``, ``latency_us`` per transfer). The
tiers are ordered: 0 is the nearest (host), the last the farthest (disk). The tiered store is a
KV connector (:mod:`servelab.core.kv_connector`): the engine never learns that tiers exist.

What goes down and what comes back is a :class:`KVTierPolicy` (``kv_tier_policy=<name>``). The
store asks it, in this order of a block's life:

- :meth:`KVTierPolicy.store_on_finish`: a request ended; its full computed blocks are on the GPU
  (write-through stores them now, while the GPU copy also stays);
- :meth:`KVTierPolicy.store_on_evict`: the GPU prefix cache gives a block up (write-back spills it);
- :meth:`KVTierPolicy.victim`: a tier is full and must make room: which of its blocks goes;
- :meth:`KVTierPolicy.demote`: where that victim goes (a farther tier, or nowhere: dropped);
- :meth:`KVTierPolicy.on_load`: a new request's prefix was found below and loaded (its reuse);
- :meth:`KVTierPolicy.on_gpu_evict`: the GPU gives up its copy of a block a tier holds (loaded
  earlier): the tier's copy is the only one again;
- :meth:`KVTierPolicy.prefetch`: a request still queued has its next prefix block below: start
  bringing it over the link now, in the background, so its admission finds it already loaded.

Each answer is a tier index or None (do not store). The store keeps the books: capacities are
never exceeded, a block is in at most one tier, a block being loaded is never dropped (loads are
copied before the step that reads them). No torch: a policy package imports this through
``servelab.plugin_api``.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, ClassVar

from servelab.core.contexts import KVTierPolicyContext
from servelab.core.interfaces import Plugin

#: The kinds of tier ``kv_tiers.tiers[i].kind`` may name.
TIER_KINDS = ("host", "disk")


@dataclass(frozen=True)
class TierSpec:
    """One tier below the GPU, as configured (``kv_tiers.tiers[i]``), with its size in blocks.

    ``capacity_gib`` is per GPU (per tensor-parallel rank), like ``backend.swap_space_gb``: each rank
    keeps its own shard of a block, and each rank's link carries it, so a transfer's time is
    ``latency_us + bytes_per_block x blocks / read_gb_s`` whatever the TP size."""

    kind: str
    capacity_gib: float
    read_gb_s: float
    write_gb_s: float
    latency_us: float
    shared: bool
    num_blocks: int

    def read_s(self, num_blocks: int, bytes_per_block: int) -> float:
        """Seconds to bring ``num_blocks`` blocks from this tier to the GPU (one transfer)."""
        return self.latency_us * 1e-6 + num_blocks * bytes_per_block / (self.read_gb_s * 1e9) if num_blocks else 0.0

    def write_s(self, num_blocks: int, bytes_per_block: int) -> float:
        """Seconds to write ``num_blocks`` blocks into this tier (one transfer)."""
        return self.latency_us * 1e-6 + num_blocks * bytes_per_block / (self.write_gb_s * 1e9) if num_blocks else 0.0


@dataclass(frozen=True, slots=True)
class TierBlock:
    """What a policy knows of a block: its digest, its index in its sequence's chain (0 = the first
    block of a prompt; -1 unknown), and how often a request has loaded it from a tier so far."""

    digest: bytes
    position: int
    loads: int = 0


class KVTierPolicy(Plugin):
    """Where KV blocks go below the GPU, and which leave a full tier. The defaults are write-back
    to the nearest tier, least recently used victims, demotion one tier down; ``none`` stores nothing."""

    context_type = KVTierPolicyContext
    context: KVTierPolicyContext
    #: False: this policy never stores a block, so the run needs no tiered store at all (``none``:
    #: the engine runs exactly as without ``kv_tiers``).
    stores: ClassVar[bool] = True

    def __init__(self, config: Any, context: KVTierPolicyContext) -> None:
        super().__init__(config, context)
        self.tiers = context.tiers

    def store_on_finish(self, block: TierBlock) -> int | None:
        """A finished request's full block (still cached on the GPU): the tier to copy it to now
        (write-through), or None. Default: None."""
        return None

    def store_on_evict(self, block: TierBlock) -> int | None:
        """A block the GPU prefix cache is giving up: the tier to spill it to, or None (lost).
        Not asked for a block a tier holds already. Default: tier 0 (write-back)."""
        return 0 if self.tiers else None

    def victim(self, tier: int, blocks: "OrderedDict[bytes, TierBlock]") -> bytes:
        """Tier ``tier`` is full: the digest of one of ``blocks`` (its blocks, least recently
        stored or loaded first) to take out. Default: the least recently used."""
        return next(iter(blocks))

    def demote(self, tier: int, block: TierBlock) -> int | None:
        """``block``, taken out of full tier ``tier``: a farther tier (> ``tier``) to move it to, or
        None to drop it. Default: the next tier, if any."""
        return tier + 1 if tier + 1 < len(self.tiers) else None

    def on_load(self, tier: int, block: TierBlock) -> None:
        """A request reused ``block`` from ``tier`` (it is copied to the GPU and stays below too)."""

    def on_gpu_evict(self, tier: int, block: TierBlock) -> None:
        """The GPU prefix cache gave up its copy of ``block``, which ``tier`` holds (a request loaded
        it, or it was written through): from now on the tier's copy is the only one."""

    def prefetch(self, tier: int, block: TierBlock, staged: int) -> bool:
        """A request waiting in the scheduler's queue will need ``block`` (its next prefix block after
        the GPU hit and any block already prefetched), which sits in ``tier``; ``staged`` blocks are
        prefetched and not yet used. True: start its load now, in the background (the store prices it
        over the tier's link off the step; the request's admission reads it without waiting for the
        link). False: leave it (and the rest of that request's chain) to load at admission. Asked
        before every step, for the queued requests in queue order. Default: False (load on hit)."""
        return False
