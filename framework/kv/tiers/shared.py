"""A KV tier shared by the replicas of a simulated cluster (``kv_tiers.tiers.<i>.shared=true``):
a Mooncake-style store that every replica reads and writes over the network.

:class:`SharedTiers` is made once per cluster (:func:`servelab.cluster.build.build_cluster`) and
handed to every replica's store. For each shared level it holds ONE book of blocks (by prefix
digest, least recently used first) that all replicas' :class:`SharedTieredKVConnector` use as that
level: its capacity is counted once for the cluster, and a prefix one replica stored is loaded by
any other. Levels with ``shared=false`` stay each replica's own.

Pricing: a shared tier sits across the network, so its link is the store's media and the
hardware profile's inter-node link (``hardware.inter_node_link_gb_s`` / ``inter_node_latency_us``,
the link :func:`servelab.kv.link.kv_link` prices a prefill->decode hand-off between nodes
with) in series: bandwidth the slower of ``read_gb_s`` / ``write_gb_s`` and the link's, per
transfer latency ``latency_us`` plus the link's. Like every tier, per GPU: each tensor-parallel
rank moves its own shard over its own NIC; ``capacity_gib`` is the whole store's, per rank.

The cluster's event loop runs one replica's step at a time, so the book changes in event order
and a run is a function of its config and seed. Not built: a shared tier on the real backend
(engine processes would need a store process), beside a prefill/decode hand-off, or on one engine.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator, MutableMapping
from dataclasses import replace
from typing import Any, Callable, Sequence as Seq

from omegaconf import DictConfig

from servelab.core.errors import ConfigError
from servelab.core.kv_tiers import TierBlock, TierSpec
from servelab.core.shapes import HardwareProfile
from servelab.kv.tiers.store import TieredKVConnector


def shared_levels(cfg: DictConfig) -> list[int]:
    """The indices of ``kv_tiers.tiers`` marked ``shared: true``."""
    node = cfg.get("kv_tiers")
    return [] if node is None else [i for i, t in enumerate(node.tiers) if t.get("shared")]


def check_shared_tiers(cfg: DictConfig) -> None:
    """A cluster with a shared tier is the simulator's (one line otherwise, naming the key)."""
    levels = shared_levels(cfg)
    if levels and cfg.backend.name != "sim":
        raise ConfigError(f"kv_tiers.tiers.{levels[0]}.shared=true with backend={cfg.backend.name}: a tier shared "
                          "by engine processes is not built (the simulator's cluster shares one: backend=sim); "
                          "use shared=false")


class SharedTiers:
    """The books of a cluster's shared tiers and the network link they are priced by."""

    def __init__(self, link_bytes_per_s: float, link_latency_s: float) -> None:
        self.link_bytes_per_s = link_bytes_per_s
        self.link_latency_s = link_latency_s
        self.books: dict[int, OrderedDict[bytes, TierBlock]] = {}

    @classmethod
    def of(cls, cfg: DictConfig) -> "SharedTiers | None":
        """The shared tiers ``cfg`` asks for (None: no tier is shared), priced by its hardware's
        inter-node link."""
        if not shared_levels(cfg):
            return None
        check_shared_tiers(cfg)
        return cls(*HardwareProfile.from_config(cfg.hardware).kv_link(False))

    def priced(self, spec: TierSpec) -> TierSpec:
        """``spec`` reached over the network: the slower bandwidth of media and link, latencies added."""
        link_gb_s = self.link_bytes_per_s / 1e9
        return replace(spec, read_gb_s=min(spec.read_gb_s, link_gb_s), write_gb_s=min(spec.write_gb_s, link_gb_s),
                       latency_us=spec.latency_us + self.link_latency_s * 1e6)

    def book(self, level: int) -> OrderedDict[bytes, TierBlock]:
        """The one book of level ``level`` every replica's store uses."""
        return self.books.setdefault(level, OrderedDict())


class _Where(MutableMapping):
    """digest -> the tier holding it, for one replica: its own tiers first (a private dict), then the
    shared books (membership is the book itself, so another replica's stores are seen at once)."""

    def __init__(self, blocks: list[OrderedDict[bytes, TierBlock]], shared: dict[int, OrderedDict[bytes, TierBlock]]
                 ) -> None:
        self.local: dict[bytes, int] = {}
        self.blocks = blocks
        self.shared = shared

    def __getitem__(self, digest: bytes) -> int:
        tier = self.local.get(digest)
        if tier is not None:
            return tier
        for level, book in self.shared.items():
            if digest in book:
                return level
        raise KeyError(digest)

    def __contains__(self, digest: object) -> bool:
        return digest in self.local or any(digest in book for book in self.shared.values())

    def __setitem__(self, digest: bytes, tier: int) -> None:
        if tier not in self.shared:  # a shared book holds the block already (the store adds it first)
            self.local[digest] = tier

    def __delitem__(self, digest: bytes) -> None:
        # The store pops the block from its tier first: a private entry goes only if its tier lost it
        # (a block taken out of a shared book may still be in this replica's own tier).
        tier = self.local.get(digest)
        if tier is not None and digest not in self.blocks[tier]:
            del self.local[digest]

    def __iter__(self) -> Iterator[bytes]:
        yield from self.local
        for book in self.shared.values():
            yield from (d for d in book if d not in self.local)

    def __len__(self) -> int:
        return sum(1 for _ in self)


class SharedTieredKVConnector(TieredKVConnector):
    """One replica's tiered store whose shared levels are the cluster's books (:class:`SharedTiers`).

    A digest may sit in this replica's private tier and in a shared tier at once (another replica
    stored it there); this replica loads it from its own tier first. A store into a shared tier that
    holds the block already only refreshes it (nothing written, nothing dropped)."""

    def __init__(self, tiers: Seq[TierSpec], bytes_per_block: int, block_size: int, shared: SharedTiers,
                 load: str = "overlap") -> None:
        super().__init__(tiers, bytes_per_block, block_size, load)
        books = {i: shared.book(i) for i, t in enumerate(self.tiers) if t.shared}
        for i, book in books.items():
            self.blocks[i] = book
        self.where = _Where(self.blocks, books)  # type: ignore[assignment]  # a dict in the base store

    def _insert(self, tier: int, block: TierBlock, write: Callable[[int, int], None] | None,
                moved_from: int | None = None) -> None:
        held = self.blocks[tier]
        if self.tiers[tier].shared and block.digest in held:
            held.move_to_end(block.digest)
            return
        super()._insert(tier, block, write, moved_from)

    def leaked(self) -> int:
        over = sum(max(0, len(b) - t.num_blocks) for b, t in zip(self.blocks, self.tiers))
        private = sum(len(b) for b, t in zip(self.blocks, self.tiers) if not t.shared)
        where: Any = self.where
        return over + abs(private - len(where.local))
