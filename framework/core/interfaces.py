"""The plugin interfaces and the small data types they exchange.

Division of labour (the executor boundary):
- a :class:`Scheduler` decides who runs this step and how many tokens each computes; it never
  touches tensors;
- a :class:`BlockAllocator` owns the logical -> physical block tables and the ref counts;
- a :class:`PreemptionPolicy` picks victims and how each is preempted when blocks run out;
- a :class:`SpeculativeDrafter` proposes draft tokens for a sequence;
- a :class:`TimeModel` predicts how long a step takes (the virtual clock's ground truth);
- a :class:`LengthPredictor` predicts how many tokens a request will generate (length-aware
  schedulers read it through :meth:`Scheduler.predicted_output_len`);
- an :class:`Evictor` chooses which cached prefix block a prefix-caching allocator gives up when
  the pool needs room;
- a :class:`Router` places each request on one replica of a cluster (``cluster.replicas``), seeing
  only :class:`ReplicaView` s;
- the executor (not a plugin) owns the KV tensors and moves data when the plan says so.

Every plugin class has a ``name`` (what ``scheduler=<name>`` selects) and a ``Config`` dataclass
of typed parameters (what ``scheduler.<field>=...`` sets; OmegaConf checks the types).
"""

from __future__ import annotations

import sys

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar, NamedTuple, Sequence as Seq

from servelab.core.contexts import (LEGACY_CONTEXT, AllocatorContext, DrafterContext, EvictorContext, PredictorContext,
                                    PreemptionContext, RouterContext, SchedulerContext, TimeModelContext)
from servelab.core.request import Request, Sequence

if TYPE_CHECKING:
    from servelab.core.step_work import DraftWork, StepWork


@dataclass
class NoConfig:
    """Config of a plugin without parameters."""


@dataclass(frozen=True)
class EngineLimits:
    """Run-wide knobs every policy sees (the top-level config keys)."""

    block_size: int
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    chunked_prefill: bool
    ttft_slo_ms: float | None = None
    tpot_slo_ms: float | None = None
    #: With ``chunked_prefill`` off, how a step is filled: ``"prefill_first"`` (vLLM v0's default
    #: scheduler, SGLang without a mixed chunk: waiting prompts whole in a prompt-only step when any
    #: fits, else the running decodes) or ``"decode_first"`` (running sequences first, whole prompts
    #: into the budget left). Ignored with chunked prefill on.
    non_chunked_schedule: str = "prefill_first"
    #: Decode steps the engine runs per scheduler call (vLLM's ``--num-scheduler-steps``); 1 = every
    #: step is scheduled (:mod:`servelab.engine.multi_step`).
    num_scheduler_steps: int = 1


@dataclass(slots=True)
class ScheduledSeq:
    """One entry of a plan: ``seq`` computes ``num_tokens`` tokens starting at ``start``.

    ``start`` is ``seq.num_computed_tokens`` when the plan was made; the chunk is
    ``seq.token_ids[start:start + num_tokens]``. A *verify* entry (speculative decoding) is a
    decode that also carries drafts: its ``num_tokens`` is ``1 + len(draft_token_ids)`` and its
    chunk is the sequence's last token followed by the drafts.
    """

    seq: Sequence
    num_tokens: int
    start: int
    draft_token_ids: tuple[int, ...] = ()


@dataclass
class PreemptionDecision:
    """How one victim is preempted, and why. ``kind`` is ``"recompute"`` or ``"swap"``.

    ``estimates`` carries whatever the policy weighed (e.g. ``{"swap_s": ..., "recompute_s": ...}``)
    so results can show each decision.
    """

    seq_id: str
    kind: str
    reason: str = ""
    estimates: dict[str, float] = field(default_factory=dict)
    num_computed_tokens: int = 0  # the victim's KV at preemption (what recompute discards), set by the scheduler


@dataclass
class SchedulePlan:
    """What one engine step does. Block operations run before the forward pass, in the order
    swap_out, swap_in, copy. Pairs are ``(src_block, dst_block)``."""

    scheduled: list[ScheduledSeq] = field(default_factory=list)
    preempted: list[PreemptionDecision] = field(default_factory=list)
    swap_out: list[tuple[int, int]] = field(default_factory=list)  # device block -> host block
    swap_in: list[tuple[int, int]] = field(default_factory=list)  # host block -> device block
    copy_blocks: list[tuple[int, int]] = field(default_factory=list)  # device -> device

    @property
    def num_batched_tokens(self) -> int:
        return sum(s.num_tokens for s in self.scheduled)

    @property
    def is_empty(self) -> bool:
        return not self.scheduled and not self.swap_out and not self.swap_in


class NextDecision(NamedTuple):
    """When a scheduler next needs to be asked (:meth:`Scheduler.next_decision`): at the latest
    after ``steps`` more steps, or at the first step that starts at or after ``at_s`` (engine
    seconds), whichever comes first. ``NextDecision(0)``: ask every step."""

    steps: int = 0
    at_s: float = float("inf")


#: ``next_decision``'s answer of a scheduler that nothing but an arrival can make decide differently.
UNTIL_ARRIVAL = NextDecision(sys.maxsize)
#: The default answer: ask every step (always correct).
EVERY_STEP = NextDecision(0)


class Plugin(ABC):
    """Common shape of every plugin: a registry name, a typed ``Config`` dataclass, and one
    constructor, ``Plugin(config, context)``, where ``context`` is the kind's frozen context
    (:mod:`servelab.core.contexts`). ``self.config`` and ``self.context`` are set here; each kind's
    base class also exposes the context's fields it always had as attributes (``self.limits``...).

    A plugin written to its kind's constructor of release 0.1 (positional collaborators after
    ``config``, listed in :attr:`legacy_args`) still works for one release: the stack builds it
    through an adapter that warns once (:func:`servelab.core.kinds.instantiate`).
    """

    name: ClassVar[str]
    Config: ClassVar[type] = NoConfig
    #: the kind's context dataclass (set on each kind's base class)
    context_type: ClassVar[type | None] = None
    #: the 0.1 constructor's positional arguments after ``config``, as context field names
    legacy_args: ClassVar[tuple[str, ...]] = ()

    def __init__(self, config: Any, context: Any = None, *legacy: Any) -> None:
        self.config = config
        self.context = _context_of(type(self), context, legacy)


def _context_of(cls: type[Plugin], context: Any, legacy: tuple[Any, ...]) -> Any:
    """``context`` itself, or, for a 0.1-style call ``(config, limits, allocator, ...)``, the full
    context the adapter is building the plugin with, else one made of the positional values."""
    wanted = cls.context_type
    if wanted is None or (isinstance(context, wanted) and not legacy):
        return context
    pending = LEGACY_CONTEXT.get()
    if isinstance(pending, wanted):
        return pending
    values = (context, *legacy)
    if len(values) > len(cls.legacy_args):
        raise TypeError(f"{cls.__qualname__}: expected ({cls.__name__}.Config, {wanted.__name__}), got "
                        f"{len(values)} arguments after the config")
    return wanted(**dict(zip(cls.legacy_args, values)))


@dataclass(frozen=True, slots=True)
class CachedBlock:
    """A full, computed KV block that entered the prefix cache.

    ``digest`` is the block's content identity (chained: it covers every token before it too) and
    ``parent`` the previous block's digest (the chain's root for the first block), so ``position``
    is how many blocks precede it: its tokens sit at ``position * block_size ..`` of every prompt
    that shares it. Losing it loses every cached block after it in the chain as well (a lookup
    walks the chain from the root and stops at the first missing block).
    """

    block: int
    digest: bytes
    parent: bytes
    position: int


class EvictorError(RuntimeError):
    """An evictor chose a block it may not (names the plugin and the block)."""


class Evictor(Plugin):
    """Chooses which cached, unreferenced KV block a prefix-caching allocator gives up for room.

    The allocator reports every event of the cache, in order, and asks :meth:`evict` only when
    it needs a block and no never-cached block is free (so nothing is evicted while the pool has
    room: an infinite pool keeps every hit). Events:

    - :meth:`on_insert`: a computed full block entered the cache (it is referenced);
    - :meth:`on_hit`: an admitted request reused a cached block (referenced or not);
    - :meth:`on_release`: the block's last reference went away: it is now evictable;
    - :meth:`evict`: return one evictable block and forget it as a candidate. The allocator
      drops it from the cache and reuses it at once.

    A block is evictable from its ``on_release`` until the next ``on_hit`` of it or its eviction.
    :meth:`evict` returning a referenced block, a block that is not cached, or None while
    evictable blocks exist stops the run with :class:`EvictorError` naming the plugin and the block.
    Evictors never change what the model computes, only which prefixes stay cached.
    """

    context_type = EvictorContext
    context: EvictorContext

    def on_insert(self, entry: CachedBlock) -> None:
        """``entry.block`` now caches ``entry.digest`` (referenced by the request that computed it)."""

    def on_hit(self, block: int) -> None:
        """An admitted request reused cached ``block``; if it was evictable it no longer is."""

    @abstractmethod
    def on_release(self, block: int) -> None:
        """Cached ``block`` has no references left: it is a candidate for eviction."""

    @abstractmethod
    def evict(self) -> int | None:
        """One evictable block (called only when at least one exists); forget it as a candidate."""


class BlockEventSubscriber:
    """Hears a prefix-caching allocator's block events, in order (:meth:`BlockAllocator.subscribe`):
    e.g. a KV connector that keeps what the GPU gives up. Blocks are named by their digest
    (``Sequence.block_hashes``) and their block id; every method is optional (a no-op here).

    The run's evictor hears the same events through its own interface (:class:`Evictor`:
    ``on_insert``, ``on_hit``, ``on_release``), because it also chooses the victim.
    """

    def on_block_stored(self, digest: bytes, block: int) -> None:
        """A computed full block joined the prefix cache as ``digest`` (referenced by its sequence)."""

    def on_block_hit(self, digest: bytes, block: int) -> None:
        """An admission reused cached ``block``."""

    def on_block_freed(self, digest: bytes, block: int) -> None:
        """Cached ``block``'s last reference went away: it stays cached, evictable."""

    def on_block_evicted(self, digest: bytes, block: int) -> None:
        """The pool gives cached ``block`` up for room: called before the block is reused, while it
        still holds ``digest``'s KV (a tier may copy it out)."""


class BlockAllocator(Plugin):
    """Owns the mapping of each sequence's logical blocks to physical KV blocks, and ref counts.

    Block ids are ``0 .. num_blocks - 1`` and index the executor's KV tensors. All methods are
    called from the scheduler's thread; none touches tensors. Nothing outside an allocator uses a
    member that is not declared here (tests/test_allocator_contract_calls.py).

    Block events: an allocator with a prefix cache (:attr:`publishes_block_events`) tells each
    subscriber (:meth:`subscribe`, a :class:`BlockEventSubscriber`) of every block stored, hit,
    freed and evicted, in order.
    """

    #: Whether :meth:`subscribe` works: the allocator keeps a prefix cache of digest-named blocks
    #: and publishes their events. May be a property of the config.
    publishes_block_events: bool = False

    context_type = AllocatorContext
    legacy_args = ("num_blocks", "block_size", "limits")
    context: AllocatorContext

    def __init__(self, config: Any, context: AllocatorContext, *legacy: Any) -> None:
        """``context``: the pool (``num_blocks``, ``block_size``), the host swap pool
        (``num_swap_blocks``, 0 = none: allocators that can swap set up their host free list from
        it), the limits, and the run's ``evictor=<name>`` (an allocator with a prefix cache asks it
        which cached block to give up)."""
        super().__init__(config, context, *legacy)
        ctx = self.context
        self.num_blocks = ctx.num_blocks
        self.block_size = ctx.block_size
        self.limits = ctx.limits
        self.num_swap_blocks = ctx.num_swap_blocks
        self.evictor: Evictor | None = ctx.evictor
        self.block_subscribers: list[BlockEventSubscriber] = []

    def subscribe(self, subscriber: BlockEventSubscriber) -> None:
        """Tell ``subscriber`` of every block event from now on (after those already subscribed).
        Raises ValueError when this allocator publishes none (:attr:`publishes_block_events`)."""
        if not self.publishes_block_events:
            raise ValueError(f"allocator {type(self).name!r} publishes no block events (no prefix cache)")
        self.block_subscribers.append(subscriber)

    @abstractmethod
    def allocate_slots(self, seq: Sequence, num_new_tokens: int) -> bool:
        """Make room for ``seq.num_computed_tokens + num_new_tokens`` tokens of ``seq``.

        All-or-nothing: return ``False`` and change nothing if the pool cannot provide the blocks.
        """

    @abstractmethod
    def free(self, seq: Sequence) -> None:
        """Release every block ``seq`` holds (ref count - 1 each). Idempotent."""

    @abstractmethod
    def block_table(self, seq_id: str) -> list[int]:
        """Physical block ids of ``seq_id`` in logical order (empty if it holds none)."""

    @abstractmethod
    def num_free_blocks(self) -> int:
        """Blocks that an allocation could use right now (including evictable cached blocks)."""

    def num_used_blocks(self) -> int:
        """Blocks referenced by at least one live sequence."""
        return self.num_blocks - self.num_free_blocks()

    def can_ever_fit(self, num_tokens: int) -> bool:
        """Whether a sequence of ``num_tokens`` tokens could be held with the pool empty."""
        return -(-num_tokens // self.block_size) <= self.num_blocks

    def admit(self, seq: Sequence) -> int:
        """Called once when ``seq`` is (re)admitted, before its first ``allocate_slots``.

        Returns how many leading tokens of ``seq.token_ids`` are already in the cache (prefix
        caching; the blocks are then referenced by ``seq``), at most ``seq.num_tokens - 1`` so
        the last token is always computed. Default: none.
        """
        return 0

    def cached_prefix_len(self, seq: Sequence) -> int:
        """How many leading tokens of ``seq.token_ids`` the cache holds right now, without
        referencing anything (what :meth:`admit` would return if called now). Prefix-aware
        schedulers call it for waiting requests every step, so it must be cheap: an allocator
        memoises the sequence's block digests. Default: 0 (no prefix cache)."""
        return 0

    def can_allocate(self, seq: Sequence, num_new_tokens: int, num_cached_tokens: int = 0) -> bool:
        """Whether admitting ``seq`` (which holds no blocks) now — :meth:`admit` referencing its
        ``num_cached_tokens`` cached leading tokens (:meth:`cached_prefix_len`), then
        ``allocate_slots(seq, num_new_tokens)`` — would succeed. No side effects: nothing is
        referenced, no evictor hears of it. A scheduler asks this every step a request waits.
        Default: the new tokens' blocks against :meth:`num_free_blocks` (exact for a paged
        allocator without a prefix cache; an allocator that reserves differently overrides it; if
        it is optimistic the scheduler's ``allocate_slots`` still refuses and the request waits)."""
        bs = self.block_size
        return -(-(num_cached_tokens + num_new_tokens) // bs) - num_cached_tokens // bs <= self.num_free_blocks()

    # ``seq.num_computed_tokens`` has two writers: the engine's apply (a step computed tokens; a
    # verification rolled drafts back) and these three allocator methods, for KV that appears or
    # disappears without being computed here. Schedulers and connectors call them; subclasses do
    # not override them (they override admit/free/on_tokens_computed).
    def start_sequence(self, seq: Sequence) -> int:
        """Admit ``seq`` (holding no blocks): reference its cached prefix (:meth:`admit`) and set
        ``seq.num_computed_tokens`` to it; returns it."""
        seq.num_computed_tokens = hit = self.admit(seq)
        return hit

    def mark_loaded(self, seq: Sequence, num_tokens: int) -> None:
        """``num_tokens`` tokens after ``seq.num_computed_tokens`` arrived through a KV connector
        into the blocks allocated for them: they count as computed. (Their blocks join the prefix
        cache with the sequence's next computed step, :meth:`on_tokens_computed`.)"""
        seq.num_computed_tokens += num_tokens

    def reset(self, seq: Sequence) -> None:
        """Drop all of ``seq``'s KV (preemption by recompute, a refused admission): :meth:`free`
        its blocks and set ``seq.num_computed_tokens`` to 0."""
        self.free(seq)
        seq.num_computed_tokens = 0

    def on_tokens_computed(self, seq: Sequence) -> None:
        """Called after a step computed tokens of ``seq`` (e.g. to hash newly full blocks)."""

    def release_slots(self, seq: Sequence, num_tokens: int) -> None:
        """Shrink ``seq``'s reservation to its first ``num_tokens`` slots (``num_tokens`` <= what
        :meth:`allocate_slots` last made room for): called after speculative decoding rejected
        drafts whose slots were reserved. Blocks wholly past the new end go back to the pool.
        Default: keep them (correct, but the pool holds the rejected slots until ``free``)."""

    def leaked_blocks(self) -> int:
        """With no live sequences: blocks still referenced (should be 0)."""
        return self.num_used_blocks()

    # Swap support (optional): allocators that can hold sequences in a host pool override these.
    def can_swap_out(self, seq: Sequence) -> bool:
        """Whether ``seq``'s blocks fit in the host swap pool now."""
        return False

    def swap_out(self, seq: Sequence) -> list[tuple[int, int]]:
        """Move ``seq`` to the host pool; return ``(device_block, host_block)`` copies to perform."""
        raise NotImplementedError(f"allocator {self.name!r} does not support swapping")

    def can_swap_in(self, seq: Sequence) -> bool:
        """Whether ``seq``'s swapped blocks fit on the device now."""
        return False

    def swap_in(self, seq: Sequence) -> list[tuple[int, int]]:
        """Bring ``seq`` back; return ``(host_block, device_block)`` copies to perform."""
        raise NotImplementedError(f"allocator {self.name!r} does not support swapping")

    def usage_stats(self) -> dict[str, float]:
        """Extra per-step gauges (e.g. ``{"kv_waste_fraction": ...}``); optional."""
        return {}

    # ---- fast-forward (``sim.fast_forward``): optional, for speed only -------------------
    def quiet_decode_tokens(self, seq: Sequence) -> int:
        """How many of ``seq``'s coming one-token decode steps are *quiet* for this allocator: in
        each, ``allocate_slots(seq, 1)`` takes no block and changes nothing but slot counts, and
        ``on_tokens_computed(seq)`` changes nothing at all. The simulator's fast-forward then skips
        both calls for those steps and reports the tokens through :meth:`count_quiet_decodes` (per
        step, all sequences together) and :meth:`settle_quiet_decodes` (per sequence, later); at
        the first step that is not quiet it calls both methods as usual, and ``allocate_slots``
        may take at most one block there. ``seq`` is decoding (one uncomputed token). Default 0:
        no step is quiet, so the fast-forward is not used with this allocator."""
        return 0

    def count_quiet_decodes(self, num_tokens: int) -> None:
        """One step computed ``num_tokens`` quiet decode tokens (over all sequences): update the
        pool-wide counts that :meth:`usage_stats` reads, as the skipped ``allocate_slots`` calls would."""

    def settle_quiet_decodes(self, seq: Sequence, num_tokens: int) -> None:
        """``seq`` computed ``num_tokens`` quiet decode tokens (already counted pool-wide by
        :meth:`count_quiet_decodes`; ``seq.num_computed_tokens`` already includes them): update
        its own slot count, as the skipped ``allocate_slots`` calls would."""


class PreemptionPolicy(Plugin):
    """Chooses victims when the pool is exhausted, and whether each is swapped or recomputed."""

    context_type = PreemptionContext
    legacy_args = ("limits", "allocator", "cost_model")
    context: PreemptionContext

    def __init__(self, config: Any, context: PreemptionContext, *legacy: Any) -> None:
        super().__init__(config, context, *legacy)
        self.limits = self.context.limits
        self.allocator = self.context.allocator
        self.cost_model = self.context.cost_model

    def select_victim(self, candidates: Seq[Sequence]) -> Sequence:
        """Pick one of ``candidates`` (non-empty, in the scheduler's order, most important
        first) and return that very object. When a running sequence needs blocks, the candidates
        include that requester itself (choosing it makes it wait). Default: the last one, i.e.
        the scheduler's own order decides."""
        return candidates[-1]

    @abstractmethod
    def decide(self, victim: Sequence) -> PreemptionDecision:
        """Return how ``victim`` is preempted. Must return ``kind="recompute"`` when swapping is
        impossible (``allocator.can_swap_out(victim)`` is false)."""


class Scheduler(Plugin):
    """Decides, each step, which sequences run and how many tokens each computes.

    The engine calls :meth:`add` when a request arrives, :meth:`schedule` once per step,
    :meth:`remove` when a sequence finishes, :meth:`abort` when one leaves early (any state) and
    :meth:`on_kv_loaded` when the KV connector (``context.connector``) finished a load the scheduler
    started (:mod:`servelab.core.kv_connector`). A scheduler allocates blocks through
    ``self.allocator`` for everything it schedules (the plan must be runnable as is), asks
    ``self.preemption`` for victims when blocks run out, and never touches tensors.
    Most schedulers subclass :class:`servelab.engine.scheduling.QueueScheduler`, which implements the
    unified token-budget loop and exposes the policy decisions as small overridable methods.

    Output-length predictions (``length_predictor=<name>``) come through one call,
    :meth:`predicted_output_len`; a scheduler that cannot work without them sets
    :attr:`needs_length_predictor` and the run refuses ``length_predictor=none`` at start-up.
    """

    #: True: this scheduler orders by predicted output length; ``length_predictor=none`` is refused.
    needs_length_predictor: ClassVar[bool] = False
    context_type = SchedulerContext
    legacy_args = ("limits", "allocator", "preemption", "cost_model")
    context: SchedulerContext

    def __init__(self, config: Any, context: SchedulerContext, *legacy: Any) -> None:
        super().__init__(config, context, *legacy)
        ctx = self.context
        self.limits = ctx.limits
        self.allocator = ctx.allocator
        self.preemption = ctx.preemption
        self.cost_model = ctx.cost_model
        predictor = ctx.length_predictor
        #: the run's predictor (None = ``length_predictor=none``, which predicts nothing)
        self.length_predictor: LengthPredictor | None = predictor if predictor is not None and predictor.predicts else None

    def predicted_output_len(self, seq: Sequence) -> float | None:
        """The predicted total number of output tokens of ``seq`` (>= 0), or None when the run has
        no predictor (``length_predictor=none``). Asked once per request (cached on the sequence),
        so it is cheap on a hot path. Remaining output is this minus ``seq.num_output_tokens``
        (it can go negative when a request outlives its prediction). A predictor that raises or
        returns a negative or non-finite length stops the run naming the predictor and the request."""
        cached = seq.predicted_output_len
        if cached is not None:
            return cached
        predictor = self.length_predictor
        if predictor is None or not predictor.predicts:
            return None
        seq.predicted_output_len = value = predict_checked(predictor, seq.request)
        return value

    @abstractmethod
    def add(self, seq: Sequence) -> None:
        """Accept a newly arrived sequence (status WAITING)."""

    def on_kv_loaded(self, seq: Sequence) -> None:
        """The KV connector (``context.connector``) finished loading the external KV of ``seq``,
        a sequence this scheduler started loading (:mod:`servelab.core.kv_connector`): its tokens
        count as computed and it may run. Default: nothing (a scheduler that never asks the
        connector never gets this; ``QueueScheduler`` seats these first)."""

    @abstractmethod
    def schedule(self, now: float) -> SchedulePlan:
        """Build the next step's plan. ``now`` is seconds since the run started.

        Contract: ``sum(num_tokens) <= limits.max_num_batched_tokens``; at most
        ``limits.max_num_seqs`` sequences; each scheduled sequence already has blocks for its
        chunk; with ``chunked_prefill`` off a sequence's uncomputed tokens are scheduled whole.
        """

    @abstractmethod
    def remove(self, seq: Sequence) -> None:
        """Forget a finished sequence (the engine frees its blocks)."""

    def abort(self, seq: Sequence) -> None:
        """Forget ``seq`` in ANY state — waiting, running (mid-prefill or decoding), swapped —
        because its client left; the engine then frees its blocks (device and host pool) and
        records it as aborted. Called between steps, never during :meth:`schedule`.

        Default: :meth:`remove`, enough for a scheduler whose ``remove`` forgets a sequence in any
        state. :class:`servelab.engine.scheduling.QueueScheduler` takes it out of whichever queue holds it
        and then calls ``remove`` (so a subclass's own bookkeeping there runs too). The engine
        checks that :meth:`num_unfinished` dropped by one and names the scheduler if not.
        """
        self.remove(seq)

    @abstractmethod
    def num_unfinished(self) -> int:
        """Sequences the scheduler still holds (waiting, running or swapped)."""

    def queue_lengths(self) -> dict[str, int]:
        """Gauges for logging, e.g. ``{"waiting": 3, "running": 8, "swapped": 0}``."""
        return {}

    def step_stats(self) -> dict[str, float]:
        """Numbers behind the last :meth:`schedule` decision (e.g. a prefill cap), logged per
        step in ``steps.jsonl``. Default: none."""
        return {}

    def next_decision(self, now: float) -> NextDecision:
        """When this scheduler next needs to be asked, for the simulator's fast-forward
        (``sim.fast_forward``). Called between steps, when every sequence the scheduler holds is
        running and decodes next (the last plan ran them all and preempted nothing). Suppose that from now on no request arrives, every
        running sequence decodes one token per step (some finish: :meth:`remove` is called) and
        every allocation succeeds: for how many coming steps would :meth:`schedule` return
        exactly that plan -- every running sequence, in the last plan's order, one decode token,
        nothing else -- and leave this scheduler's state as if it had not been called (or as the
        next call rebuilds it)? For those steps the engine does not call :meth:`schedule`.

        A wrong answer changes results; ``servelab check-plugin`` runs a workload with the
        fast-forward on and off and names the scheduler when they differ. Default
        :data:`EVERY_STEP` (always correct); :data:`UNTIL_ARRIVAL` when only an arrival changes
        a decision."""
        return EVERY_STEP


@dataclass
class Drafts:
    """A drafter's proposal for a batch of sequences, in the order they were given.

    ``token_ids[i]`` follows ``seqs[i].token_ids``; ``probs[i]`` (optional) is the drafter's
    distribution each draft was drawn from, a float tensor ``[len(token_ids[i]), vocab]``; without
    it a draft counts as certain (one-hot), which is what rejection sampling assumes of ngram drafts.
    """

    token_ids: list[list[int]]
    probs: list[Any] | None = None


class SpeculativeDrafter(Plugin):
    """Proposes draft tokens that the target model verifies in one step (speculative decoding).

    The engine calls :meth:`propose` once per step, after applying it, with every running
    sequence that just got a token (the next step's decode candidates), and stores each
    proposal on ``seq.draft_token_ids``. The scheduler decides how many of them a decode
    verifies (token budget and blocks permitting; drafts never preempt anyone). Verification
    keeps the longest prefix the target agrees with plus one token of the target's own, so
    outputs never depend on the drafter — only speed does. The engine truncates a proposal
    longer than ``k`` or holding ids outside the vocabulary (and warns, naming the drafter).

    A drafter may keep per-sequence state (keyed by ``seq.id``); :meth:`on_verified` reports
    each verification, :meth:`forget` a sequence that ended. Its :class:`DrafterContext` holds
    ``executor``, ``allocator`` and ``seed`` (also ``self.executor`` ...): a drafter that runs a
    second model asks the executor to (:meth:`model_path` names the checkpoint it must load beside
    the target).
    """

    # True when proposing runs forward passes of a draft model (a time model prices them on the
    # virtual clock as model passes); False: host work only, like an n-gram lookup.
    runs_model: ClassVar[bool] = False
    context_type = DrafterContext
    legacy_args = ("limits",)
    context: DrafterContext

    def __init__(self, config: Any, context: DrafterContext, *legacy: Any) -> None:
        super().__init__(config, context, *legacy)
        ctx = self.context
        self.limits = ctx.limits
        self.executor = ctx.executor
        self.allocator = ctx.allocator
        self.seed = ctx.seed

    @property
    def num_speculative_tokens(self) -> int:
        """Upper bound ``k`` on drafts per sequence per step (0 = speculative decoding off)."""
        return 0

    @classmethod
    def model_path(cls, config: Any, target_path: str | None) -> str | None:
        """A draft checkpoint the executor must load beside the target model (default: none)."""
        return None

    @abstractmethod
    def propose(self, seqs: Seq[Sequence], k: int) -> "Drafts | list[list[int]]":
        """Up to ``k`` draft ids to follow each ``seqs[i].token_ids`` (an empty list drafts
        nothing for that sequence); a plain list of lists means no probabilities."""

    def on_verified(self, seq: Sequence, num_drafts: int, num_accepted: int) -> None:
        """``num_accepted`` of the ``num_drafts`` drafts verified for ``seq`` were kept (adaptive
        ``k`` hooks here). Default: nothing."""

    def forget(self, seq: Sequence) -> None:
        """``seq`` ended (finished or aborted): drop any state kept for it. Default: nothing."""


class LengthPredictorError(RuntimeError):
    """A length predictor raised or returned an impossible length (names the plugin and the request)."""


def predict_checked(predictor: "LengthPredictor", request: Request) -> float:
    """``predictor.predict(request)`` as a float >= 0, or :class:`LengthPredictorError` naming both."""
    where = f"length_predictor plugin {type(predictor).name!r} on request {request.id!r}"
    try:
        value = predictor.predict(request)
    except Exception as exc:  # any failure is reported with the plugin and the request
        raise LengthPredictorError(f"{where} raised {type(exc).__name__}: {exc}") from exc
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise LengthPredictorError(f"{where} returned {value!r}, not a number of tokens") from None
    if not number >= 0 or number == float("inf"):
        raise LengthPredictorError(f"{where} returned {value!r}: a predicted length must be a finite number >= 0")
    return number


class LengthPredictor(Plugin):
    """Predicts how many tokens a request will generate, from what a server sees when it arrives
    (the :class:`~servelab.core.request.Request`: prompt token ids, ``max_tokens``, sampling, client).

    Schedulers read predictions through :meth:`Scheduler.predicted_output_len` (asked once per
    request, cached). A prediction is a number of output tokens >= 0 (fractional is fine); it only
    orders work, it never changes what the model computes. ``predicts = False`` marks ``none``.
    """

    predicts: ClassVar[bool] = True

    context_type = PredictorContext
    context: PredictorContext

    @abstractmethod
    def predict(self, request: Request) -> float:
        """Predicted number of output tokens of ``request`` (>= 0)."""


class TimeModel(Plugin):
    """Predicts how long one engine step takes (seconds) from what it does.

    On ``clock=virtual`` the engine advances time by :meth:`predict` for every step it executes,
    so every latency is a function of config + workload + seed. A time model is the *ground truth*
    of that virtual world; policies never read it (they learn step costs through
    ``self.cost_model`` from the times they observe, as on the wall clock).

    ``measured = True`` marks the wall clock's stand-in (steps take what they take); such a model
    is never asked to predict.
    """

    measured: ClassVar[bool] = False

    context_type = TimeModelContext
    context: TimeModelContext

    @abstractmethod
    def predict(self, work: "StepWork") -> float:
        """Seconds the step described by ``work`` takes (>= 0), swap/copy traffic included."""

    def predict_draft(self, draft: "DraftWork") -> float:
        """Seconds spent proposing the next step's drafts (speculative decoding): the draft model's
        forward passes, or an n-gram lookup's host time. Default 0: the model does not price
        drafting (``roofline``, ``profile``); ``auto``, ``op_profile`` and ``calibrated_roofline`` do."""
        return 0.0

    def swap_bytes_per_s(self) -> float | None:
        """The host link a swap crosses in this model's world, if it has one; on the virtual clock
        the policies' cost model takes it instead of timing a copy on this machine."""
        return None

    def describe(self) -> dict[str, Any]:
        """What ``summary.json`` records about this model (its name and coefficients)."""
        return {"name": self.name}


@dataclass(frozen=True, slots=True)
class ReplicaView:
    """What a router may know of one replica when it places a request.

    Only what a real router has at that moment: the replica's identity and size, the requests it
    placed there and has not yet seen finish (counted by the router itself), and the gauges a
    replica's metrics endpoint reports (queue lengths, KV use) as of the replica's last step
    boundary at or before the request's arrival. ``can_hold``: the request fits this replica at
    all (its prompt plus ``max_tokens`` within the replica's context and KV pool); a router must
    choose a replica that can hold the request.
    """

    index: int  # the replica's id in the cluster: what :meth:`Router.route` returns
    role: str  # "mixed" (prefill and decode), "prefill" or "decode"
    can_hold: bool
    num_outstanding: int  # requests placed here and not yet finished
    outstanding_tokens: int  # their prompt + max_tokens, summed
    num_waiting: int  # the replica's scheduler queues at its last step boundary
    num_running: int
    kv_utilization: float  # used / all KV blocks at its last step boundary
    num_kv_blocks: int
    block_size: int
    tensor_parallel_size: int = 1


class RouterError(RuntimeError):
    """A router placed a request where it may not go (names the plugin and the request)."""


class Router(Plugin):
    """Places each arriving request on one replica of a cluster (``router=<name>``).

    The cluster calls :meth:`route` once per request and stage: with ``cluster.replicas=N`` once on
    arrival, offered every replica; with prefill/decode disaggregation once on arrival, offered the
    prefill replicas, and once more when its prompt is prefilled, offered the decode replicas (the
    views' ``role`` says which). :meth:`route` returns the ``index`` of one offered replica whose
    ``can_hold`` is true; anything else (an index not offered, a replica that cannot hold it, None,
    an exception) stops the run with :class:`RouterError` naming the plugin and the request.
    A router sees the request as it arrives (prompt, ``max_tokens``, ``client_id``, arrival time),
    never how many tokens it will generate. Placement never changes what the model computes.
    """

    context_type = RouterContext
    context: RouterContext

    @abstractmethod
    def route(self, request: Request, replicas: Seq[ReplicaView], now: float) -> int:
        """The ``index`` of the replica (one of ``replicas``) that serves ``request`` at ``now``."""

    def on_finish(self, request: Request, replica: int) -> None:
        """``request``, placed on ``replica``, finished there (or was rejected or aborted): a router
        that keeps per-request state drops it here. Default: nothing."""
