"""The tiered KV store below the GPU pool, seen by the engine only as a KV connector.

It keeps, per tier (``kv_tiers.tiers``, nearest first), the blocks it holds by prefix digest, in
least-recently-used order, never more than the tier's capacity; a block lives in at most one tier.
The run's :class:`~servelab.core.kv_tiers.KVTierPolicy` decides what is stored and where, and what
leaves a full tier; this class keeps the books and checks every answer (a policy that names a
block the tier does not hold, or a tier that does not exist, stops the run naming it).

The connector's side of a request (:mod:`servelab.core.kv_connector`):

- ``get_num_new_matched_tokens``: after the GPU prefix hit, the next prompt blocks whose digests
  the tiers hold, in chain order (one missing block ends the match): those tokens are loaded, not
  computed. Loads are synchronous: the bytes are in place before the next forward pass. The
  scheduler asks when it considers the request for admission, in its policy's order, and again
  after a preemption by recompute: such a *reload* is counted apart (``reloads``, ``reload_blocks``),
  not in the hit rate, which is over new requests' prompt blocks.
- ``update_state_after_alloc``: the load is booked (bytes per tier, the policy's ``on_load``)
  and its seconds wait for the step that reads it: the connector reports them
  (``get_step_transfer_time``, with ``kv_tiers.load``: ``overlap`` or ``serialize``) and the
  engine prices them like any connector's (:func:`servelab.engine.clock.price_kv_transfer`);
- ``request_finished``: the policy may store the sequence's blocks now (write-through); the
  blocks are never kept (this connector reads nothing later);
- the allocator's block events (:meth:`BlockAllocator.subscribe`), an eviction: the policy may
  spill the block (write-back);
- ``get_finished`` (the engine's poll, before each schedule): prefetch. For each request waiting
  for admission (one the scheduler asked about, on arrival or at an admission that did not happen
  yet, and has not admitted: ``update_state_after_alloc`` or ``request_finished`` ends that), the policy's :meth:`~servelab.core.kv_tiers.KVTierPolicy.prefetch`
  may start loading its next prefix blocks found below. A prefetch is a load started early: its
  bytes cross the tier's link in the background (one transfer per request and tier, starting when
  the request arrived or when that link's previous prefetch ends, whichever is later: a real
  scheduler sees a request on arrival, the simulated engine between steps; never added to a step;
  the synchronous loads of admissions are not queued behind it), and the block is *staged*; the request's
  admission then loads it as before but waits only for what of that transfer is not done yet
  (usually nothing; never more than loading those blocks then would take). A staged block stays in its tier (the books are unchanged); one that leaves its
  tier, or is never read by an admission, is wasted. On a real engine the copy itself still happens
  at admission (a prefetch there only books the figures).

In the simulator a block is its digest (no tensors); the bytes moved are counted and priced per
link. On a real engine :meth:`TieredKVConnector.attach_bytes` gives it the tiers' tensors
(:class:`servelab.kv.tiers.pools.TierPools`): each held block has a slot, and every store, move
and load copies the block's KV there and back. The scheduler-side calls only decide and queue
those copies; the worker side runs them, in the order decided, in :meth:`start_load_kv` (before
the forward pass that reads the loads, and before it overwrites a block given up for room) and
:meth:`save_kv` (after each step). A slot given up while a copy that reads it is queued is taken
again only by copies queued after it, so it stays pinned until its copy is done. Stores are
asynchronous to the step (copy engines), so they cost no step time; they are
counted in ``bytes written`` per tier.
"""

from __future__ import annotations

import functools
from collections import OrderedDict
from typing import Any, Callable, Sequence as Seq

from servelab.core.block_hash import block_hashes
from servelab.core.errors import ConfigError
from servelab.core.interfaces import BlockEventSubscriber
from servelab.core.kv_connector import NO_TRANSFER, KVConnector, KVTransferTime
from servelab.core.kv_tiers import KVTierPolicy, TierBlock, TierSpec
from servelab.core.request import Sequence


LOAD_MODES = ("overlap", "serialize")  # kv_tiers.load


class KVTierPolicyError(RuntimeError):
    """A tier policy answered something the store may not do (names the plugin and the answer)."""


class TieredKVConnector(KVConnector, BlockEventSubscriber):
    """Host / disk tiers below one engine's GPU pool."""

    name = "kv_tiers"

    def __init__(self, tiers: Seq[TierSpec], bytes_per_block: int, block_size: int, load: str = "overlap") -> None:
        if load not in LOAD_MODES:
            raise ValueError(f"kv_tiers.load={load!r}: one of {LOAD_MODES}")
        self.overlap = load == "overlap"  # loads stream behind the step's compute, else the step waits for them
        self.tiers = tuple(tiers)
        self.bytes_per_block = bytes_per_block
        self.block_size = block_size
        self.blocks: list[OrderedDict[bytes, TierBlock]] = [OrderedDict() for _ in self.tiers]
        self.where: dict[bytes, int] = {}  # digest -> the tier holding it
        self.positions: dict[bytes, int] = {}  # digest -> its index in its chain, as last seen
        self.policy: KVTierPolicy | None = None
        self.allocator: Any = None
        self._looked_up: set[str] = set()
        self._pending_blocks = [0] * len(self.tiers)  # loaded since the last step was priced, per tier
        # figures (summary.json: kv_tier_figures)
        self.lookup_blocks = 0  # prompt blocks of new requests the GPU cache missed
        self.hit_blocks = [0] * len(self.tiers)  # of those, loaded from each tier
        self.written_blocks = [0] * len(self.tiers)
        self.dropped_blocks = [0] * len(self.tiers)
        self.max_held = [0] * len(self.tiers)
        self.loads = 0  # new requests that loaded anything
        self.reloads = 0  # of those loads, by requests preempted by recompute (their prefix came back from a tier)
        self.reload_blocks = [0] * len(self.tiers)  # blocks those reloads read, per tier (not in hit_blocks)
        self.load_added_s = 0.0  # step time loads added (serialised, or not hidden behind compute)
        self.load_hidden_s = 0.0  # load time hidden behind the step's compute
        self.load_s_by_request: dict[str, float] = {}  # each loading request's link time
        self.added_s_by_request: dict[str, float] = {}  # of the step time loads added, each loader's share
        self._pending_requests: dict[str, float] = {}  # loaded since the last step was priced
        # A list: every event is appended, ("store"|"drop"|"load", tier, digest) or ("move", tier,
        # digest, to_tier), in order (the conformance kit replays them); None: not recorded.
        self.trace: list[tuple] | None = None
        self.host_memory: Any = None  # the host memory a tier shares with the swap pool (share_host)
        self.host_tier = -1
        self.pools: Any = None  # the tiers' real bytes (attach_bytes); None: digests only (the simulator)
        self.slots: list[dict[bytes, int]] = [{} for _ in self.tiers]
        self._copies: list[Callable[[], None]] = []  # byte copies decided, run by the worker side in order
        self.free_slots: list[list[int]] = [[] for _ in self.tiers]
        # prefetch: the requests asked about and not yet admitted, in the order first asked; the clock's now
        self._queued: dict[str, Sequence] = {}
        self.now: Callable[[], float] = lambda: 0.0
        self.staged: dict[bytes, float] = {}  # prefetched, not yet read: digest -> when its bytes have landed
        self._link_free = [0.0] * len(self.tiers)  # when each tier's link finishes its last prefetch
        self._pending_wait_s = 0.0  # admissions' wait for prefetches still in flight, since the last step
        self.prefetched_blocks = 0
        self.prefetch_used_blocks = 0
        self.prefetch_link_s = 0.0  # link time prefetches took, off the steps

    def attach_bytes(self, pools: Any) -> "TieredKVConnector":
        """Hold real bytes: ``pools`` has ``save(tier, slot, block)``, ``load(tier, slot, block)`` and
        ``move(tier, slot, to_tier, to_slot)`` over ``num_blocks`` slots per tier."""
        self.pools = pools
        self.free_slots = [list(range(t.num_blocks - 1, -1, -1)) for t in self.tiers]
        return self

    def bind(self, policy: KVTierPolicy, allocator: Any) -> "TieredKVConnector":
        """Use ``policy`` and subscribe to ``allocator``'s block events (its evictions: a prefix cache)."""
        if not allocator.publishes_block_events:
            raise ConfigError(f"kv_tiers: tiers below the GPU hold prefix-cache blocks; allocator="
                              f"{type(allocator).name} needs allocator=paged allocator.prefix_caching=true")
        self.policy, self.allocator = policy, allocator
        allocator.subscribe(self)
        return self

    def use_clock(self, now: Callable[[], float]) -> "TieredKVConnector":
        """Time prefetches on ``now`` (the virtual clock's; not called on the real engine, where a
        prefetch has landed at once)."""
        self.now = now
        return self

    # ---- scheduler side -----------------------------------------------------------------
    def _prompt_digests(self, seq: Sequence) -> list[bytes]:
        """``seq``'s block digests but the last token's block (the last token is always computed)."""
        return block_hashes(seq, self.block_size)[:(seq.num_tokens - 1) // self.block_size]

    def get_num_new_matched_tokens(self, seq: Sequence, num_computed_tokens: int) -> tuple[int, bool]:
        digests = self._prompt_digests(seq)
        first = num_computed_tokens // self.block_size
        if seq.id not in self._queued:
            self._queued[seq.id] = seq
        if seq.id not in self._looked_up and not seq.num_preemptions:  # a new request's, counted once however
            self._looked_up.add(seq.id)  # often the scheduler asks
            self.lookup_blocks += max(0, len(digests) - first)
        where, n = self.where, 0
        for digest in digests[first:]:
            if digest not in where:
                break
            n += 1
        return n * self.block_size, False

    def update_state_after_alloc(self, seq: Sequence, block_ids: Seq[int], num_external_tokens: int) -> None:
        self._looked_up.discard(seq.id)
        self._queued.pop(seq.id, None)  # admitted
        if num_external_tokens <= 0:
            return
        assert self.policy is not None, "bind() the store to its policy first"
        if self._prefetches():  # the scheduler admits it at once: it queued from its arrival to now
            self._prefetch_for(seq)
        digests = self._prompt_digests(seq)
        first = seq.num_computed_tokens // self.block_size
        per_tier = [0] * len(self.tiers)
        link_tier = [0] * len(self.tiers)  # of per_tier, the blocks not prefetched
        wait_s = 0.0
        for j in range(first, first + num_external_tokens // self.block_size):
            digest = digests[j]
            tier = self.where[digest]
            landed = self.staged.pop(digest, None)
            if landed is not None:  # prefetched: no link time now, but what is still in flight
                self.prefetch_used_blocks += 1
                wait_s = max(wait_s, landed - self.now())
            entry = self.blocks[tier].pop(digest)
            entry = TierBlock(digest, j, entry.loads + 1)
            self.blocks[tier][digest] = entry  # most recently used now
            self.positions[digest] = j
            per_tier[tier] += 1
            link_tier[tier] += landed is None
            if self.pools is not None:
                self._copies.append(functools.partial(self.pools.load, tier, self.slots[tier][digest], block_ids[j]))
            if self.trace is not None:
                self.trace.append(("load", tier, digest))
            self.policy.on_load(tier, entry)
        counted = self.reload_blocks if seq.num_preemptions else self.hit_blocks
        for tier, n in enumerate(per_tier):
            counted[tier] += n
            self._pending_blocks[tier] += link_tier[tier]
        self.loads += not seq.num_preemptions
        self.reloads += bool(seq.num_preemptions)
        # A prefetch still stuck behind others on its link is no worse than loading its blocks now.
        staged_s = sum(t.read_s(n - m, self.bytes_per_block) for t, n, m in zip(self.tiers, per_tier, link_tier))
        wait_s = min(wait_s, staged_s)
        self._pending_wait_s = max(self._pending_wait_s, wait_s)
        load_s = wait_s + sum(t.read_s(n, self.bytes_per_block) for t, n in zip(self.tiers, link_tier))
        self._pending_requests[seq.id] = load_s
        if not seq.num_preemptions:  # a new request's load (a reload is counted apart)
            self.load_s_by_request[seq.id] = load_s

    def request_finished(self, seq: Sequence, block_ids: Seq[int]) -> bool:
        self._looked_up.discard(seq.id)
        self._queued.pop(seq.id, None)
        policy = self.policy
        assert policy is not None, "bind() the store to its policy first"
        for j, digest in enumerate(block_hashes(seq, self.block_size)[:seq.num_computed_tokens // self.block_size]):
            self.positions[digest] = j
            if digest in self.where:
                continue
            tier = self._checked_tier(policy.store_on_finish(TierBlock(digest, j)), "store_on_finish", digest)
            if tier is not None:
                self._insert(tier, TierBlock(digest, j), self._from_gpu(block_ids[j]))
        return False

    # ---- worker side ----------------------------------------------------------------------
    def start_load_kv(self) -> None:
        """Run the queued copies (stores, moves, loads) in the order they were decided: before the
        forward pass that reads the loads and may overwrite a block given up for room."""
        self._run_copies()

    def save_kv(self) -> None:
        """Run the copies the step's ends queued (write-through of finished requests' blocks, still intact)."""
        self._run_copies()

    def _run_copies(self) -> None:
        copies, self._copies = self._copies, []
        for copy in copies:
            copy()

    def get_step_transfer_time(self) -> KVTransferTime:
        """The seconds the loads booked since the last call take over their links (one transfer per
        tier, one after the other, plus any wait for a prefetch still in flight); resets the count."""
        pending, self._pending_blocks = self._pending_blocks, [0] * len(self.tiers)
        wait_s, self._pending_wait_s = self._pending_wait_s, 0.0
        load_s = wait_s + sum(t.read_s(n, self.bytes_per_block) for t, n in zip(self.tiers, pending))
        return KVTransferTime(load_s, 0.0, self.overlap) if load_s else NO_TRANSFER

    def get_finished(self) -> tuple[set[str], set[str]]:
        """Nothing is ever sent or received asynchronously; the poll before each schedule prefetches."""
        if self.host_memory is not None:
            self.host_memory.settle()  # the last step's swap copies are done
        self.prefetch_queued()
        return set(), set()

    def prefetch_queued(self) -> None:
        """Start the prefetches the policy wants for the queued requests (see the module's docstring)."""
        if not self._prefetches():
            return
        queued = list(self._queued.values())
        # Between steps every staged block was staged for a request still queued; one that is no longer
        # wanted (its request was served from the GPU cache, or ended) is wasted and frees its room.
        wanted = {digest for seq in queued for digest in self._prompt_digests(seq)}
        for digest in [d for d in self.staged if d not in wanted]:
            del self.staged[digest]
        for seq in queued:
            self._prefetch_for(seq)

    def _prefetches(self) -> bool:
        return self.policy is not None and type(self.policy).prefetch is not KVTierPolicy.prefetch

    def _prefetch_for(self, seq: Sequence) -> None:
        policy = self.policy
        assert policy is not None
        per_tier: list[list[bytes]] = [[] for _ in self.tiers]
        digests = self._prompt_digests(seq)
        for j in range(self.allocator.cached_prefix_len(seq) // self.block_size, len(digests)):
            digest = digests[j]
            tier = self.where.get(digest)
            if tier is None:
                break
            if digest in self.staged:
                continue
            if not policy.prefetch(tier, self.blocks[tier][digest], len(self.staged)):
                break
            self.staged[digest] = 0.0
            per_tier[tier].append(digest)
            if self.trace is not None:
                self.trace.append(("prefetch", tier, digest))
        self._send_prefetch(per_tier, min(seq.arrival_s, self.now()))

    def _send_prefetch(self, per_tier: list[list[bytes]], arrived_s: float) -> None:
        for tier, staged in enumerate(per_tier):
            if not staged:
                continue
            link_s = self.tiers[tier].read_s(len(staged), self.bytes_per_block)
            landed = self._link_free[tier] = max(arrived_s, self._link_free[tier]) + link_s
            self.prefetch_link_s += link_s
            self.prefetched_blocks += len(staged)
            for digest in staged:
                self.staged[digest] = landed

    def transfer_priced(self, added_s: float, hidden_s: float) -> None:
        """The last priced step's loads added ``added_s`` to it and hid ``hidden_s`` behind compute; the
        added time is shared among that step's loading requests in proportion to their link time."""
        self.load_added_s += added_s
        self.load_hidden_s += hidden_s
        pending, self._pending_requests = self._pending_requests, {}
        total = sum(pending.values())
        for request_id, load_s in pending.items():  # a reload keeps the first load's share
            self.added_s_by_request.setdefault(request_id, added_s * load_s / total if total else 0.0)

    # ---- the books ------------------------------------------------------------------------
    def _from_gpu(self, block_id: int) -> Callable[[int, int], None] | None:
        pools = self.pools
        return None if pools is None else (lambda tier, slot: pools.save(tier, slot, block_id))

    def on_block_evicted(self, digest: bytes, block_id: int) -> None:
        """The GPU pool gives ``block_id`` up: the policy may spill it (write-back)."""
        assert self.policy is not None
        tier = self.where.get(digest)
        if tier is not None:  # written through or loaded: the GPU copy was a second one
            self.policy.on_gpu_evict(tier, self.blocks[tier][digest])
            return
        block = TierBlock(digest, self.positions.get(digest, -1))
        tier = self._checked_tier(self.policy.store_on_evict(block), "store_on_evict", digest)
        if tier is not None:
            self._insert(tier, block, self._from_gpu(block_id))

    def _insert(self, tier: int, block: TierBlock, write: Callable[[int, int], None] | None,
                moved_from: int | None = None) -> None:
        """Put ``block`` in ``tier`` (from the GPU, or demoted from tier ``moved_from``), making room
        first (the policy's victims, demoted or dropped); ``write(tier, slot)`` copies its bytes
        (None: no bytes, the simulator)."""
        assert self.policy is not None
        held = self.blocks[tier]
        if self.capacity(tier) < 1:  # a host memory the swap fills: nothing is stored there now
            self.dropped_blocks[tier] += 1
            if self.trace is not None and moved_from is not None:
                self.trace.append(("drop", moved_from, block.digest))
            return
        while len(held) >= self.capacity(tier):
            self._give_up(tier)
        if self.pools is not None:
            slot = self.slots[tier][block.digest] = self.free_slots[tier].pop()
            assert write is not None, "a store with bytes writes every block it takes"
            self._copies.append(functools.partial(write, tier, slot))
        held[block.digest] = block
        self.where[block.digest] = tier
        self.written_blocks[tier] += 1
        if self.trace is not None:
            self.trace.append(("store", tier, block.digest) if moved_from is None
                              else ("move", moved_from, block.digest, tier))
        self.max_held[tier] = max(self.max_held[tier], len(held))

    def _give_up(self, tier: int) -> None:
        """Tier ``tier`` gives up one block, its policy's victim: demoted to a farther tier or dropped."""
        assert self.policy is not None
        held, spec = self.blocks[tier], self.tiers[tier]
        digest = self.policy.victim(tier, held)
        if digest not in held:
            raise KVTierPolicyError(f"kv_tier_policy plugin {self.policy.name!r}: victim({tier}) returned "
                                    f"{digest!r}, which tier {tier} ({spec.kind}) does not hold")
        victim = held.pop(digest)
        del self.where[digest]
        self.staged.pop(digest, None)  # a prefetch of it is wasted: the admission will not find it below
        slot = self.slots[tier].pop(digest, None)
        below = self._checked_tier(self.policy.demote(tier, victim), "demote", digest, above=tier)
        if below is None:
            self.dropped_blocks[tier] += 1
            if self.trace is not None:
                self.trace.append(("drop", tier, digest))
        else:
            self._insert(below, victim, self._from_slot(tier, slot), moved_from=tier)
        if slot is not None:
            self.free_slots[tier].append(slot)

    def capacity(self, tier: int) -> int:
        """Blocks tier ``tier`` may hold now: its size, or what the swap pool leaves of a host memory
        the two share (:meth:`share_host`)."""
        if self.host_memory is not None and tier == self.host_tier:
            return int(self.host_memory.tier_capacity())
        return self.tiers[tier].num_blocks

    def share_host(self, memory: Any, tier: int) -> "TieredKVConnector":
        """Tier ``tier`` holds its blocks in ``memory`` (:class:`servelab.kv.tiers.host_memory.HostMemory`)
        beside the swap pool: it holds at most what the swap leaves, gives a block up when a swap-out needs
        one, and (real bytes) takes its slots from the memory's free ones."""
        self.host_memory, self.host_tier = memory, tier
        memory.tier_held = lambda: len(self.blocks[tier])
        memory.reclaim = lambda: self._give_up(tier)
        if self.pools is not None:
            self.free_slots[tier] = memory.tier_slots()
        return self

    def _from_slot(self, tier: int, slot: int | None) -> Callable[[int, int], None] | None:
        pools = self.pools
        if pools is None or slot is None:
            return None
        return lambda to_tier, to_slot: pools.move(tier, slot, to_tier, to_slot)

    def _checked_tier(self, tier: int | None, call: str, digest: bytes, above: int = -1) -> int | None:
        if tier is None:
            return None
        if not (isinstance(tier, int) and above < tier < len(self.tiers)):
            assert self.policy is not None
            wanted = f"a tier below {above}" if above >= 0 else f"a tier index 0..{len(self.tiers) - 1}"
            raise KVTierPolicyError(f"kv_tier_policy plugin {self.policy.name!r}: {call} returned {tier!r} for "
                                    f"block {digest.hex()[:12]}, not {wanted} or None")
        return tier

    def leaked(self) -> int:
        """Books that disagree (0 when sound): blocks over a capacity, or held by no / two tiers."""
        over = sum(max(0, len(b) - t.num_blocks) for b, t in zip(self.blocks, self.tiers))
        return over + abs(sum(len(b) for b in self.blocks) - len(self.where))
