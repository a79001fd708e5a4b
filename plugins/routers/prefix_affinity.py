"""``router=prefix_affinity``: the replica that most likely holds the longest prefix of the prompt
in its cache, unless it is much busier than the least busy one.

After SGLang's cache-aware router (sgl-router, "cache_aware" policy; also llm-d's prefix-cache
scorer): a router cannot see the replicas' prefix caches, so it keeps its own approximate record of
what it sent where. Per replica, an LRU of the prompt blocks it routed there (``block_size`` tokens
each, chained: a block's key covers every token before it, so a match is a shared *prefix*), at most
``capacity_fraction`` x the replica's ``num_kv_blocks`` blocks. A request's match on a replica is
the number of its leading full blocks in that record. The request's ``cache_salt`` is part of the
chain's root: tenants with different salts share no blocks in the replicas' caches, so none here.

Load cap (SGLang's ``balance_abs_threshold`` / ``balance_rel_threshold``): only replicas that can
hold the request and have ``num_outstanding <= balance_rel x min + balance_abs`` (min over those
that can hold it) are candidates. Among them the longest match wins; ties go to the fewest
outstanding requests, then the lowest index. A match shorter than ``cache_threshold`` of the prompt's
blocks is not worth following (SGLang's ``cache_threshold``, 0.5 by default there too): the request
then goes to the candidate with the smallest record (the most cache room), ties as above. Without it
a prefix every request shares (a system prompt) would draw all traffic to the first replica. The chosen replica's record then takes the prompt's
blocks (each moved to the recent end), and the least recent blocks beyond its capacity are dropped.

Cost per request: each full block of the prompt is hashed once (Python's ``hash`` of a tuple of its
parent key and its tokens), and that key list serves every replica's match and the insert:
O(prompt blocks x replicas) dictionary look-ups. Keys are only ever compared for equality, so the
per-process randomisation of ``str`` hashing (the salt) never changes a placement. On a
prefill/decode cluster the prefill pool is where a hit saves work; the decode pool is routed the
same way (a decode replica's cache also receives the prompt's KV).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from servelab.plugin_api import ReplicaView, Request, Router


def chain_keys(tokens: Sequence[int], block_size: int, salt: str | None) -> list[int]:
    """One key per full block of ``tokens``, each covering the salt and every token up to its end."""
    key = hash(("servelab-prefix-root", salt))
    keys = []
    for start in range(0, len(tokens) - block_size + 1, block_size):
        key = hash((key, tuple(tokens[start:start + block_size])))
        keys.append(key)
    return keys


def match_length(record: OrderedDict[int, None], keys: list[int]) -> int:
    """How many leading ``keys`` ``record`` holds."""
    n = 0
    for key in keys:
        if key not in record:
            break
        n += 1
    return n


@dataclass
class PrefixAffinityConfig:
    balance_abs: int = 8  # a candidate has at most balance_rel x min + balance_abs outstanding requests
    balance_rel: float = 1.5
    capacity_fraction: float = 1.0  # blocks remembered per replica, as a fraction of its num_kv_blocks
    cache_threshold: float = 0.5  # follow a match only if it covers at least this fraction of the prompt's blocks


class PrefixAffinityRouter(Router):
    """Longest remembered prefix among the replicas within the load cap; fewest outstanding on ties."""

    name = "prefix_affinity"
    Config = PrefixAffinityConfig

    def __init__(self, config: PrefixAffinityConfig, context) -> None:
        super().__init__(config, context)
        if config.balance_abs < 0:
            raise ValueError(f"router.balance_abs={config.balance_abs} must be >= 0")
        if not config.balance_rel >= 1:
            raise ValueError(f"router.balance_rel={config.balance_rel:g} must be >= 1")
        if not config.capacity_fraction > 0:
            raise ValueError(f"router.capacity_fraction={config.capacity_fraction:g} must be > 0")
        if not 0 <= config.cache_threshold <= 1:
            raise ValueError(f"router.cache_threshold={config.cache_threshold:g} must be in [0, 1]")
        self.records: dict[int, OrderedDict[int, None]] = {}  # replica index -> block keys, least recent first

    def route(self, request: Request, replicas: Sequence[ReplicaView], now: float) -> int:
        holding = [v for v in replicas if v.can_hold]
        cap = self.config.balance_rel * min(v.num_outstanding for v in holding) + self.config.balance_abs
        keys_by_size: dict[int, list[int]] = {}  # replicas of one pool share a block size: hashed once
        best, best_rank, roomiest, roomiest_rank = None, None, None, None  # the least loaded is within the cap
        for view in holding:
            if view.num_outstanding > cap:
                continue
            keys = keys_by_size.get(view.block_size)
            if keys is None:
                keys = keys_by_size[view.block_size] = chain_keys(request.prompt_token_ids, view.block_size,
                                                                  request.cache_salt)
            record = self.records.get(view.index)
            matched = match_length(record, keys) if record else 0
            rank = (matched / max(1, len(keys)), -view.num_outstanding, -view.index)
            if best_rank is None or rank > best_rank:
                best, best_rank = view, rank
            room = (-(len(record) if record else 0), -view.num_outstanding, -view.index)
            if roomiest_rank is None or room > roomiest_rank:
                roomiest, roomiest_rank = view, room
        assert best is not None and best_rank is not None and roomiest is not None  # views is not empty
        if best_rank[0] < self.config.cache_threshold or best_rank[0] == 0:
            best = roomiest
        self._remember(best, keys_by_size[best.block_size])
        return best.index

    def match(self, request: Request, view: ReplicaView) -> int:
        """How many leading full blocks of ``request``'s prompt the record of ``view``'s replica holds."""
        record = self.records.get(view.index)
        keys = chain_keys(request.prompt_token_ids, view.block_size, request.cache_salt)
        return match_length(record, keys) if record else 0

    def _remember(self, view: ReplicaView, keys: list[int]) -> None:
        record = self.records.setdefault(view.index, OrderedDict())
        # Deepest block first, the root last: the root ends most recent, so a prefix is forgotten from
        # its tail (as a replica's own LRU gives up leaves first), never cut off at its head.
        for key in reversed(keys):
            record[key] = None
            record.move_to_end(key)
        capacity = max(1, int(view.num_kv_blocks * self.config.capacity_fraction))
        while len(record) > capacity:
            record.popitem(last=False)
