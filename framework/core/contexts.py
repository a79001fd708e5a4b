"""What each plugin kind is built with: one frozen, typed context per kind.

Every plugin is constructed the same way, ``Plugin(config, context)``: ``config`` is its own typed
``Config`` (what ``<kind>.<field>=...`` sets) and ``context`` the dataclass below for its kind,
holding exactly what that kind may use. Nothing is attached after construction. The stack fills
a context by field name (:func:`servelab.core.kinds.build_context`): a field named like another
kind (``allocator``, ``evictor``, ``length_predictor``, ...) receives that kind's plugin, built
first; the others come from the run (``limits``, ``cost_model``, ``num_blocks``, ...). A kind
added to the table gets its context filled the same way, without touching the stack.

No torch and no Hydra here: plugin modules import these through :mod:`servelab.plugin_api`.
"""

from __future__ import annotations

import contextvars
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from servelab.core.tier_view import TierView

if TYPE_CHECKING:
    from servelab.core.cost_model import StepCostModel
    from servelab.core.engine_host import EngineHost
    from servelab.core.executor import Executor
    from servelab.core.interfaces import (BlockAllocator, EngineLimits, Evictor, LengthPredictor, PreemptionPolicy,
                                          ReplicaView)
    from servelab.core.kv_connector import KVConnector
    from servelab.core.kv_tiers import KVTierPolicy, TierSpec
    from servelab.core.shapes import HardwareProfile, ModelShape


@dataclass(frozen=True)
class SchedulerContext:
    """A scheduler's collaborators: the run's limits, the allocator it asks for blocks, the
    preemption policy it asks for victims, the policies' step-cost model, the output-length
    predictor (None for ``length_predictor=none``) and the KV connector (None: no KV enters the
    engine from outside)."""

    limits: "EngineLimits"
    allocator: "BlockAllocator"
    preemption: "PreemptionPolicy"
    cost_model: "StepCostModel"
    length_predictor: "LengthPredictor | None" = None
    connector: "KVConnector | None" = None


@dataclass(frozen=True)
class AllocatorContext:
    """An allocator's pool: ``num_blocks`` device blocks of ``block_size`` tokens, the host swap
    pool (``num_swap_blocks``, 0 = none), the run's limits, and the evictor a prefix cache asks
    which cached block to give up (None: the allocator's own default). ``host_blocks``: with tiers
    on, the swap pool's free blocks as the host memory it shares with the host tier hands them out
    (``len``, ``popleft``, ``extend``; None: the allocator's own ``range(num_swap_blocks)``)."""

    num_blocks: int
    block_size: int
    limits: "EngineLimits"
    evictor: "Evictor | None" = None
    num_swap_blocks: int = 0
    host_blocks: Any = None


@dataclass(frozen=True)
class PreemptionContext:
    """A preemption policy's view: the limits, the allocator (can a victim swap out?) and the
    policies' step-cost model (what recomputing or swapping would cost)."""

    limits: "EngineLimits"
    allocator: "BlockAllocator"
    cost_model: "StepCostModel"


@dataclass(frozen=True)
class DrafterContext:
    """A speculative drafter's view: the limits, the executor (a drafter that runs a draft model
    asks it to), the allocator (block tables a draft model's KV follows) and the run's seed."""

    limits: "EngineLimits"
    executor: "Executor | None" = None
    allocator: "BlockAllocator | None" = None
    seed: int = 0


@dataclass(frozen=True)
class EvictorContext:
    """What an evictor is built for: the pool it serves and the policies' step-cost model
    (``cost_model.recompute_seconds(n)`` and ``coefficient_vector()`` price recomputing tokens)."""

    num_blocks: int
    block_size: int
    cost_model: "StepCostModel"


@dataclass(frozen=True)
class KVTierPolicyContext:
    """What a KV tier policy is built for: the tiers below the GPU (``kv_tiers.tiers``, nearest
    first, each sized in blocks), the GPU pool's size and a block's bytes per rank, the seed
    (a randomised policy draws from it, so runs repeat), and ``tier_view``: a live, read-only view of
    each tier's occupancy (``held(tier)``, ``tier_of(digest)``) and of the GPU prefix cache
    (``gpu_hits(digest)``: admissions that reused a block from it; ``on_gpu(digest)``)."""

    kv_tiers: "tuple[TierSpec, ...]" = ()
    num_blocks: int = 0
    block_size: int = 16
    bytes_per_block: int = 0
    seed: int = 0
    tier_view: TierView = field(default_factory=TierView)

    @property
    def tiers(self) -> "tuple[TierSpec, ...]":
        return self.kv_tiers


class EngineClock:
    """The engine's time as a KV connector reads it: :meth:`now` in engine seconds (those of its
    requests' timestamps), 0 until the stack binds it to the engine it built."""

    def __init__(self) -> None:
        self._now: "Callable[[], float] | None" = None

    def bind(self, now: "Callable[[], float]") -> None:
        self._now = now

    def now(self) -> float:
        return self._now() if self._now is not None else 0.0


@dataclass(frozen=True)
class KVClusterLink:
    """An engine's place in a cluster, as its KV connector sees it: the replica's ``index`` and
    ``role`` (``mixed``, ``prefill`` or ``decode``), the cluster's KV ``transport`` between replicas
    (the simulator's :class:`~servelab.kv.pd.sim.PDTransfers`, an in-process
    :class:`~servelab.kv.pd.local.LocalKVLink`, an engine process's
    :class:`~servelab.kv.pd.process.ProcessLink`; None: no hand-off), the name of the ``kv_connector``
    built-in that hands KV over that transport (``pd_sim``, ``pd_local``, ``pd_process``; "" for none)
    and the cluster's shared KV tiers (:class:`~servelab.kv.tiers.shared.SharedTiers`; None: none)."""

    index: int = 0
    role: str = "mixed"
    transport: Any = None
    hand_off: str = ""
    shared_tiers: Any = None


@dataclass(frozen=True)
class KVConnectorContext:
    """What a KV connector (``kv_connector=<name>``) is built for; a field is None where the run
    has no such thing.

    ``block_events``: the allocator whose block events a connector may subscribe to (a prefix block
    stored, hit, evicted); ``kv_pool``: the device KV pool the executor exposes
    (``Executor.kv_pool``: ``data[layers, 2, blocks, block_size, kv_heads, head_dim]`` and
    ``scales``; None in the simulator, which moves no bytes); ``clock``: the engine's
    :class:`EngineClock` (``clock.now()`` in engine seconds, valid once the engine runs); ``cluster``: the replica's
    :class:`KVClusterLink` (None: a single engine). The tiers below the GPU (``kv_tiers``, their
    ``kv_tier_policy``, ``kv_tier_disk_dir`` and ``kv_tier_load``: how a load meets its step), the pool's geometry (``block_size``,
    ``bytes_per_block`` per rank), ``host_memory`` (the one host memory the host tier shares with the
    swap pool, :mod:`servelab.kv.tiers.host_memory`; None: the tier has its own), ``computes_tokens`` (False: the simulator, where a block is its
    digest and bytes are only priced), ``at_close`` (register a callable run when the executor shuts
    down: files, pinned memory), the ``seed`` and ``build`` (a connector by name, with its default
    ``Config`` and this context: ``multi`` composes its parts with it) complete it."""

    block_size: int = 16
    bytes_per_block: int = 0
    block_events: "BlockAllocator | None" = None
    kv_pool: Any = None
    clock: EngineClock | None = None
    cluster: KVClusterLink | None = None
    kv_tiers: "tuple[TierSpec, ...]" = ()
    kv_tier_policy: "KVTierPolicy | None" = None
    kv_tier_disk_dir: str | None = None
    kv_tier_load: str = "overlap"
    host_memory: Any = None
    computes_tokens: bool = False
    at_close: "Callable[[Callable[[], None]], Any] | None" = None
    seed: int = 0
    build: "Callable[[str], KVConnector] | None" = None


@dataclass(frozen=True)
class PredictorContext:
    """What a length predictor is built for: the run's model and limits.

    ``model_name`` is ``model.name`` (``tiny_code``, ``llama3_70b``, ``hf`` ...); ``model_path`` the
    checkpoint directory (None for a catalogue shape or the random tiny model); a predictor trained
    for one model refuses another at start-up by comparing these.
    """

    model_name: str
    model_path: str | None
    vocab_size: int
    max_model_len: int
    seed: int = 0


@dataclass(frozen=True)
class TimeModelContext:
    """What a time model is built for: the model's shape, the hardware, the parallelism, the dtypes.

    ``hardware`` is a :class:`servelab.core.shapes.HardwareProfile` (the ``hardware=`` choice) and
    ``shape`` a :class:`servelab.core.shapes.ModelShape`; ``bytes_per_block`` is one KV block on one rank.
    """

    shape: "ModelShape"
    hardware: "HardwareProfile"
    tensor_parallel_size: int
    dtype: str
    weight_dtype_bytes: float
    kv_dtype_bytes: float
    block_size: int
    model_name: str = ""
    linear_weight_bytes: float | None = None  # model.quantization=int8: 1 per decoder-linear weight (None = dtype)
    kv_scale_bytes: float = 0.0  # kv_cache_dtype=int8|fp8_e4m3: one float32 scale per (token, KV head)
    draft_shape: "ModelShape | None" = None  # drafter=draft_model: the draft model's shape (it runs on rank 0)
    # The engine's timing features (``sim.*``, docs/simulator.md "Engine timing features"); the
    # defaults price every step eagerly with the NCCL all-reduce tables, as before they existed.
    cuda_graph_sizes: tuple[int, ...] = ()  # sim.cuda_graphs: decode batch sizes run as captured CUDA graphs
    all_reduce: str = "nccl"  # sim.all_reduce: nccl | custom | auto
    # engine=<preset>: its host time per step and whether it overlaps the GPU step (None: the time
    # model's own host term, added to the step, as before engines had presets)
    engine_host: "EngineHost | None" = None
    # Mixture-of-experts models (servelab.sim.moe_pricer): experts split over this many groups of the
    # tensor-parallel ranks, and how a step's tokens are routed (``sim.moe``)
    expert_parallel_size: int = 1
    moe_routing_skew: float = 0.0  # Zipf exponent of expert popularity; 0 = uniform
    moe_seed: int = 0
    moe_routing_trace: str | None = None  # replay each token's experts from this file instead
    moe_ep_exchange: str = "all_to_all"  # EP's token exchange: all_to_all (DeepEP) | all_reduce (the real engine's)
    # expert_placement=<name>: which rank holds each expert (servelab.core.expert_placement; None: linear)
    expert_placement: Any = None
    # expert_cache=<name>: which experts stay on the GPU, the rest offloaded (servelab.core.expert_cache; None: all)
    expert_cache: Any = None
    # data_parallel_attention=true: attention data-parallel over the tensor_parallel_size ranks beside EP
    # (each rank its own sequences, whole KV heads, attention weights replicated; servelab.sim.dp_attention)
    data_parallel_attention: bool = False
    # pipeline_parallel_size > 1: the layers split into stages of tensor_parallel_size ranks each, as many
    # batches in flight as stages (servelab.sim.pipeline); stages on one node while they fit gpus_per_node
    pipeline_parallel_size: int = 1
    gpus_per_node: int = 8

    @property
    def attention_tp(self) -> int:
        """The ranks one sequence's attention is split over: 1 under data-parallel attention."""
        return 1 if self.data_parallel_attention else self.tensor_parallel_size

    @property
    def kv_bytes_per_token(self) -> float:
        """K and V of one token on one rank (scales of a quantised cache included)."""
        return self.shape.kv_bytes_per_token(self.kv_dtype_bytes, self.attention_tp, self.kv_scale_bytes)

    @property
    def bytes_per_block(self) -> float:
        return self.kv_bytes_per_token * self.block_size

    @property
    def weight_bytes_per_rank(self) -> float:
        if self.data_parallel_attention:
            return self.shape.dp_attention_weight_bytes_per_rank(self.weight_dtype_bytes, self.tensor_parallel_size,
                                                                 self.linear_weight_bytes)
        return self.shape.weight_bytes_per_rank(self.weight_dtype_bytes, self.tensor_parallel_size,
                                                self.linear_weight_bytes)


@dataclass(frozen=True)
class RouterContext:
    """What a router is built for: the cluster's replicas (their ``index``, ``role``, pool size),
    as views at time 0, and the run's seed (random routers draw from ``random.Random(seed)``)."""

    replicas: "tuple[ReplicaView, ...]"
    seed: int = 0


@dataclass(frozen=True)
class MigrationPolicyContext:
    """What a migration policy is built for: the cluster's ``num_replicas``, how often the cluster
    asks it (``interval_s``, ``cluster.migration_interval_s``) and the run's seed."""

    num_replicas: int
    interval_s: float = 1.0
    seed: int = 0


@dataclass(frozen=True)
class ExecutorContext:
    """What an executor is built for (``backend=<name>``): everything about the model, the pool and
    the parallelism that the run decided, as plain values.

    ``worker``: the real model's worker settings (``servelab.exec.executor.WorkerConfig``; None in
    the simulator); ``shape`` / ``hardware`` / ``memory``: the simulator's model shape, spec sheet
    and memory plan (None on a real backend); ``num_swap_blocks`` / ``swap_space_gb``: the host
    swap pool; ``draft_model_path``: a draft checkpoint to load beside the target.
    """

    model_name: str
    tensor_parallel_size: int = 1
    num_kv_blocks: int | None = None
    expert_parallel_size: int = 1  # a MoE layer's experts split this many ways over the tensor-parallel ranks
    pipeline_parallel_size: int = 1  # stages of tensor_parallel_size ranks each
    num_swap_blocks: int | None = None
    swap_space_gb: float | None = None
    worker: Any = None
    shape: "ModelShape | None" = None
    hardware: "HardwareProfile | None" = None
    memory: Any = None
    draft_model_path: str | None = None


#: The full context :func:`servelab.core.kinds.instantiate` builds a 0.1-style plugin with, while
#: that plugin's own ``__init__`` passes its positional collaborators up to the base class.
LEGACY_CONTEXT: "contextvars.ContextVar[object | None]" = contextvars.ContextVar("servelab_legacy_context",
                                                                                 default=None)
