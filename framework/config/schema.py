"""The typed config schema Hydra composes into: the top-level keys (:class:`ServelabConfig`) and
every non-plugin group's dataclass (model, hardware, logger, cluster, SLOs, sim, front end, KV tiers,
the commands' own keys). Unknown keys and wrong types are rejected at compose time. The workloads'
schemas are :mod:`servelab.config.workloads`."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, List, Optional

from omegaconf import MISSING

from servelab.core.executor import BackendConfig  # the backend group's schema
from servelab.config.engine import EngineConfig  # the engine group's schema (and its resolvers)


class DType(enum.Enum):
    float32 = "float32"
    bfloat16 = "bfloat16"
    float16 = "float16"


class AttentionBackend(enum.Enum):
    auto = "auto"
    torch = "torch"
    triton = "triton"


class Quantization(enum.Enum):
    """``model.quantization``: ``int8`` = weight-only INT8 of every decoder linear layer (``servelab.exec.quant``)."""

    none = "none"
    int8 = "int8"


class KVCacheDType(enum.Enum):
    """``kv_cache_dtype``: ``auto`` = the model's dtype; ``int8`` / ``fp8_e4m3`` = quantised K/V with one
    float32 scale per token and KV head (``servelab.kernels.kv_quant``)."""

    auto = "auto"
    int8 = "int8"
    fp8_e4m3 = "fp8_e4m3"


class NonChunkedSchedule(enum.Enum):
    """``non_chunked_schedule`` (only with ``chunked_prefill=false``): ``prefill_first`` = waiting
    prompts whole in prompt-only steps when any fits (vLLM v0, SGLang without a mixed chunk);
    ``decode_first`` = running sequences first, whole prompts into the budget left."""

    prefill_first = "prefill_first"
    decode_first = "decode_first"


class Clock(enum.Enum):
    auto = "auto"  # virtual for backend=sim, wall otherwise
    wall = "wall"
    virtual = "virtual"


class AllReduceImpl(enum.Enum):
    """``sim.all_reduce``: how the simulator prices a tensor-parallel all-reduce (docs/simulator.md)."""

    nccl = "nccl"  # the hardware's NCCL table (or the calibrated roofline's formula)
    custom = "custom"  # vLLM's / SGLang's custom one-shot / two-shot all-reduce, every message
    auto = "auto"  # custom where vLLM 0.6 uses it (TP 2/4/6/8 on NVLink, message < 8 MiB), NCCL otherwise


# vLLM's CUDA-graph capture sizes for decode: ``_BATCH_SIZES_TO_CAPTURE = [1, 2, 4] +
# [_BATCH_SIZE_ALIGNMENT * i for i in range(1, 33)]`` with ``_BATCH_SIZE_ALIGNMENT = 8`` in
# vllm/worker/model_runner.py (v0.5/v0.6 era; v0.6.x: the default max_seq_len_to_capture path)
VLLM_CUDA_GRAPH_SIZES = [1, 2, 4] + list(range(8, 257, 8))


@dataclass
class ModelConfig:
    """``path`` = an HF-format checkpoint directory; null = the embedded tiny model below, written
    once with random weights (seeded) to the cache folder and loaded through the same loader.
    ``model=tiny_code`` / ``model=tiny_code_draft`` set ``path`` to a trained checkpoint shipped in
    the package (the shape fields then do not apply: the checkpoint's config.json rules).

    ``shape_only`` entries (the catalogue: ``model=llama3_70b`` ...) are public ``config.json``
    shapes without weights, for ``backend=sim``. With ``backend=sim`` a ``path`` may also point
    at any ``config.json`` (or the directory holding one)."""

    name: str = "tiny"
    path: Optional[str] = None
    shape_only: bool = False
    dtype: DType = DType.float32
    quantization: Quantization = Quantization.none  # int8: decoder linears in INT8 (embeddings, LM head stay in dtype)
    architecture: str = "LlamaForCausalLM"
    hidden_size: int = 256
    intermediate_size: int = 688
    num_hidden_layers: int = 4
    num_attention_heads: int = 8
    num_key_value_heads: int = 4
    vocab_size: int = 4096
    max_position_embeddings: int = 4096
    tie_word_embeddings: bool = False
    initializer_range: float = 0.02
    weights_seed: int = 0
    head_dim: Optional[int] = None  # null = hidden_size / num_attention_heads
    # Mixture of experts (0 experts = dense; servelab.core.shapes.ModelShape): routed experts, how many run
    # per token, their width, the shared experts (width null = moe_intermediate_size), which layers are MoE
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    num_shared_experts: int = 0
    shared_expert_intermediate_size: Optional[int] = None
    first_dense_layers: int = 0  # DeepSeek's first_k_dense_replace
    moe_layer_step: int = 1  # Qwen's decoder_sparse_step: every step-th layer is MoE
    norm_topk_prob: bool = True  # the random tiny MoE model: renormalise the top-k routing weights (Mixtral always does)
    # Multi-head latent attention (DeepSeek-V2/V3; 0 = ordinary attention): the KV cache holds
    # kv_lora_rank + qk_rope_head_dim values per token and layer
    kv_lora_rank: int = 0
    q_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    qk_nope_head_dim: int = 0
    v_head_dim: int = 0


@dataclass
class HardwareConfig:
    """An accelerator's spec sheet (``conf/hardware/*.yaml``; decimal GB). The time models and the
    simulator's memory accounting read it; the torch backend on its wall clock does not."""

    name: str = MISSING
    memory_gb: float = MISSING
    hbm_bandwidth_gb_s: float = MISSING
    peak_tflops: float = MISSING  # dense bf16/fp16
    link_bandwidth_gb_s: float = MISSING  # GPU<->GPU per direction (NVLink, or PCIe)
    host_link_gb_s: float = MISSING  # GPU<->host per direction (PCIe)
    link_latency_us: float = 10.0  # per all-reduce call
    # KV transfers between replicas (prefill/decode disaggregation), per GPU and direction
    intra_node_link_gb_s: Optional[float] = None  # null = link_bandwidth_gb_s (NVLink, or PCIe)
    intra_node_latency_us: float = 10.0
    inter_node_link_gb_s: float = 25.0  # a 200 Gb/s NIC per GPU unless the hardware file says otherwise
    inter_node_latency_us: float = 20.0
    # Hardware without measured op tables (docs/op-tables.md "Hardware without tables"): the hardware
    # whose measured compute and collective tables price it, this sheet's HBM rescaling the decoder
    # layers (null: its own tables, or the calibrated roofline); and the rule in words, for the banner
    tables_from: Optional[str] = None
    pricing_rule: Optional[str] = None


class LoggerMode(enum.Enum):
    """``logger.mode``: W&B's run modes (``wandb.init(mode=...)``); ``shared``: W&B's several-writers-one-run mode."""

    offline = "offline"  # written under the run's folder; ``wandb sync`` uploads it
    online = "online"
    disabled = "disabled"  # no W&B run (as logger=none)
    shared = "shared"


@dataclass
class LoggerConfig:
    name: str = "wandb"
    mode: LoggerMode = LoggerMode.offline
    project: str = "servelab"
    entity: Optional[str] = None
    group: Optional[str] = None
    tags: list[str] = field(default_factory=list)
    log_requests_table: bool = True
    log_every_steps: int = 100  # the step series: one point per window of N steps (its means, maxima, sums)
    log_min_interval_s: float = 0.25  # ... and of at least this much wall time (0: exactly N steps)
    table_max_rows: int = 1000  # the requests table: beyond this many rows, an even sample of them
    step_interval: Optional[int] = None  # deprecated name of log_every_steps (wins when set)


class KVLink(enum.Enum):
    """``cluster.kv_link``: which link a KV transfer crosses. ``auto``: replicas take GPUs in order
    (prefill pool first), ``cluster.gpus_per_node`` per node; same node = NVLink, else the network."""

    auto = "auto"
    intra_node = "intra_node"
    inter_node = "inter_node"


@dataclass
class PoolConfig:
    """One pool of a disaggregated cluster (``cluster.prefill`` / ``cluster.decode``): what differs
    from the run's top-level keys; null = the run's value. ``hardware`` names a ``conf/hardware`` option."""

    tensor_parallel_size: Optional[int] = None
    hardware: Optional[str] = None
    num_kv_blocks: Optional[int] = None
    max_num_seqs: Optional[int] = None
    max_num_batched_tokens: Optional[int] = None
    kv_cache_dtype: Optional[KVCacheDType] = None
    block_size: Optional[int] = None


@dataclass
class ClusterConfig:
    """More than one engine (docs/cluster.md). ``replicas``: N identical engines behind ``router=``;
    ``prefill_replicas`` / ``decode_replicas``: prefill/decode disaggregation instead (both or neither),
    each pool shaped by ``prefill`` / ``decode``, the KV of each prompt moved over ``kv_link``, its
    transfer streamed layer by layer during the prefill when ``overlap_kv_transfer``. ``migration_*``,
    ``draining`` and ``drain_from_s``: live migration between colocated replicas (``migration_policy=``);
    ``autoscale_interval_s``, ``min_replicas`` / ``max_replicas``, ``cold_start_gb_s`` and ``warm_pool``:
    a cluster that grows and shrinks (``autoscaler=``)."""

    replicas: int = 1
    prefill_replicas: Optional[int] = None
    decode_replicas: Optional[int] = None
    prefill: PoolConfig = field(default_factory=PoolConfig)
    decode: PoolConfig = field(default_factory=PoolConfig)
    gpus_per_node: int = 8
    kv_link: KVLink = KVLink.auto
    overlap_kv_transfer: bool = True
    # live migration (migration_policy=..., docs/cluster.md "Live migration"): how often the policy is
    # asked; pre-copy stages while the request decodes (false: one stop-and-copy of all its KV); the
    # stop-and-copy starts once a stage has at most migration_stop_blocks new blocks to copy, or after
    # migration_max_stages pre-copy stages
    migration_interval_s: float = 1.0
    migration_precopy: bool = True
    migration_stop_blocks: int = 1
    migration_max_stages: int = 8
    # replicas that drain (take no new request; a migration policy moves their running ones away) from
    # drain_from_s on
    draining: List[int] = field(default_factory=list)
    drain_from_s: float = 0.0
    # autoscaling (autoscaler=..., docs/cluster.md "Autoscaling"): how often the autoscaler is asked; the
    # bounds (null: cluster.replicas, the initial size); a started replica reads its weights at
    # cold_start_gb_s (7.0: one PCIe Gen4 NVMe data-center SSD's sequential read, Samsung PM1733 datasheet
    # 7,000 MB/s); warm_pool replicas stand by with their weights loaded and serve at once when started
    autoscale_interval_s: float = 5.0
    min_replicas: Optional[int] = None
    max_replicas: Optional[int] = None
    cold_start_gb_s: float = 7.0
    warm_pool: int = 0


@dataclass
class SLOConfig:
    ttft_ms: Optional[float] = None
    tpot_ms: Optional[float] = None


@dataclass
class FairnessConfig:
    """The weights of a client's service in the fairness figures (docs/metrics.md): service =
    ``input_weight`` x prompt tokens + ``output_weight`` x output tokens (VTC's w_p = 1, w_q = 2)."""

    input_weight: float = 1.0
    output_weight: float = 2.0


class RequestsFormat(enum.Enum):
    """``results.requests_format``: what each line of ``requests.jsonl`` says of a request's
    inter-token latencies (docs/results.md)."""

    jsonl = "jsonl"  # every field, itl_ms the full list of gaps (the default)
    stats = "stats"  # itl_ms replaced by itl_ms_stats: the request's mean, p50, p90, p99, max gap (long runs)


@dataclass
class ResultsConfig:
    """How a run writes its results (docs/results.md)."""

    # jsonl: each requests.jsonl line lists every inter-token latency (itl_ms); stats: it gives the
    # request's mean, p50, p90, p99 and max instead (itl_ms_stats), ~10x faster to write on long
    # runs; summary.json is the same either way
    requests_format: RequestsFormat = RequestsFormat.jsonl


@dataclass
class SimMoeConfig:
    """How a mixture-of-experts model's tokens are routed in the simulator (servelab.sim.moe_routing):
    the experts a step touches set its expert cost."""

    routing_skew: float = 0.0  # Zipf exponent of expert popularity (0 = uniform), drawn per token
    seed: int = 0  # the routing draws' generator (the same steps draw the same routing)
    routing_trace: Optional[str] = None  # replay each token's experts from this .npy / .json instead
    # expert parallelism's token exchange per MoE layer: all_to_all (DeepEP's dispatch + combine) |
    # all_reduce (the batch on every rank, one all-reduce sums the experts' outputs: backend=tp's EP)
    ep_exchange: str = "all_to_all"
    # expert offloading (expert_cache=lru|lfu|prefetch): experts of each rank's share kept on the GPU per
    # MoE layer, the rest in host memory (0: all resident, expert_cache=none); servelab.sim.moe_cache
    expert_cache_slots: int = 0


@dataclass
class SimConfig:
    """The simulator's own switches (``backend=sim`` on ``clock=virtual``)."""

    # run the quiet decode steps between two decisions at once (servelab.engine.fast_forward);
    # false: every step is scheduled (the results are identical: docs/simulator.md)
    fast_forward: bool = True
    # price a decode-only step of B sequences as the next captured size >= B (eager above the
    # largest): vLLM's CUDA graphs pad the batch; prompt and mixed steps run eagerly
    cuda_graphs: bool = False
    cuda_graph_sizes: List[int] = field(default_factory=lambda: list(VLLM_CUDA_GRAPH_SIZES))
    all_reduce: AllReduceImpl = AllReduceImpl.nccl
    moe: SimMoeConfig = field(default_factory=SimMoeConfig)


@dataclass
class FrontendConfig:
    """``frontend``: the API server in front of the engine (HTTP, tokenisation, detokenisation),
    priced on the virtual clock (docs/simulator.md "Engine timing features"). A request reaches the
    engine ``per_request_s + per_prompt_token_s x prompt_len`` after the client sent it; each step's
    tokens reach the client after one serial front end has spent ``per_output_token_s`` on each;
    ``in_engine_process``: that token work is the engine's (vLLM <= 0.5), added to the step's time.
    All zero (``frontend=none``): requests and tokens pass at once, as before."""

    name: str = "none"
    per_request_s: float = 0.0
    per_prompt_token_s: float = 0.0
    per_output_token_s: float = 0.0
    in_engine_process: bool = False
    source: Optional[str] = None  # where a preset's figures come from (a command, a URL and its quote)


class KVTierKind(enum.Enum):
    host = "host"
    disk = "disk"


class KVTierLoad(enum.Enum):
    """``kv_tiers.load``: how a load from a tier meets the step that reads it (servelab.engine.clock.price_kv_transfer)."""

    overlap = "overlap"  # layer by layer behind compute: the step takes max(load, compute)
    serialize = "serialize"  # before compute: the step takes load + compute


@dataclass
class KVTierConfig:
    """One tier below the GPU (``kv_tiers.tiers[i]``, nearest first). Capacity per GPU (tensor-parallel
    rank), like ``backend.swap_space_gb``; bandwidths in GB/s (1e9 bytes) of that rank's link to the GPU;
    ``latency_us`` per transfer. ``shared``: one store for a simulated cluster's replicas, priced over the network
    (:mod:`servelab.kv.tiers.shared`; refused on one engine and on the real backend)."""

    kind: KVTierKind = KVTierKind.host
    capacity_gib: float = 64.0
    read_gb_s: float = 25.0
    write_gb_s: float = 25.0
    latency_us: float = 10.0
    shared: bool = False


@dataclass
class KVTiersConfig:
    """``kv_tiers``: the KV cache tiers below the GPU pool (``kv_tiers=none|host|host_disk``; docs/kv-tiers.md).
    What goes down and comes back is ``kv_tier_policy=<name>``: a preset with tiers selects
    :data:`KV_TIERS_DEFAULT_POLICY` unless one is given (``none``: nothing, whatever this says)."""

    name: str = "none"
    tiers: List[KVTierConfig] = field(default_factory=list)
    load: KVTierLoad = KVTierLoad.overlap
    disk_dir: Optional[str] = None  # real engine: the folder of a disk tier's files (memory-mapped)


#: The policy a ``kv_tiers=<preset>`` with tiers selects unless ``kv_tier_policy=`` says otherwise: the
#: kind's grade reference (spill what the GPU prefix cache gives up into the nearest tier).
KV_TIERS_DEFAULT_POLICY = "write_back"


def kv_tier_presets() -> dict[str, KVTiersConfig]:
    """``kv_tiers=<name>``: PCIe 5 x16 host memory (about 25 GB/s achieved per direction of its 64) and an
    NVMe drive (7 GB/s read, 5 GB/s write, about 100 us per request) per GPU."""
    host = KVTierConfig(KVTierKind.host, 64.0, 25.0, 25.0, 10.0)
    disk = KVTierConfig(KVTierKind.disk, 1024.0, 7.0, 5.0, 100.0)
    return {"none": KVTiersConfig(), "host": KVTiersConfig("host", [host]),
            "host_disk": KVTiersConfig("host_disk", [host, disk])}


@dataclass
class DebugConfig:
    log_steps: bool = False  # write steps.jsonl (per-step decisions)


@dataclass
class EvalPPLConfig:
    """``servelab eval-ppl``: held-out perplexity of the configured checkpoint through servelab's
    model. ``window`` null = the model's context (``max_position_embeddings``, capped by
    ``max_model_len``); ``max_tokens`` null = the whole held-out split; ``output_dir``: an alias of
    ``hydra.run.dir`` (which wins); null = ``outputs/eval-ppl/<date>/<time>``."""

    window: Optional[int] = None
    max_tokens: Optional[int] = None
    batch_windows: int = 8
    output_dir: Optional[str] = None  # alias of hydra.run.dir


@dataclass
class BenchConfig:
    """``servelab bench`` (docs/bench.md): one run per load point, Poisson ``rates`` (req/s) or
    closed-loop ``concurrencies`` (clients), exactly one of them; the knee is the highest load
    before the first point where the ``percentile``-th TTFT / TPOT exceeds ``slo.ttft_ms`` /
    ``slo.tpot_ms`` (or a request did not finish). ``output_dir``: an alias of ``hydra.run.dir``
    (which wins); null = ``outputs/bench/<date>/<time>``."""

    rates: Optional[list[float]] = None
    concurrencies: Optional[list[int]] = None
    percentile: float = 90.0
    output_dir: Optional[str] = None


@dataclass
class ServeConfig:
    """``servelab serve``: the OpenAI-compatible server (flags ``--host``/``--port``/``--api-key``
    set the first three). ``api_key`` null = no authentication. Bounds: request bodies over
    ``max_body_bytes`` get 413; once ``max_waiting_requests`` wait in the scheduler new ones get 503;
    on SIGINT/SIGTERM in-flight requests get ``shutdown_grace_s`` seconds to finish, then are
    aborted. ``default_max_tokens``: when a request gives none (OpenAI's completions default).
    ``model_name`` null = ``model.name``; ``output_dir``: an alias of ``hydra.run.dir`` (which wins);
    null = ``outputs/serve/<date>/<time>``."""

    host: str = "127.0.0.1"
    port: int = 8000
    api_key: Optional[str] = None
    model_name: Optional[str] = None
    max_body_bytes: int = 1_000_000
    max_waiting_requests: int = 256
    default_max_tokens: int = 16
    shutdown_grace_s: float = 10.0
    output_dir: Optional[str] = None


@dataclass
class RouteConfig:
    """``servelab route`` (docs/route.md): an OpenAI-compatible router running ``router=<name>`` in
    front of backends. ``replicas``: how many ``servelab serve`` processes it starts itself with the
    composed stack (alias ``replicas=N`` on its command line); ``backends``: URLs of running
    OpenAI-compatible servers to use instead (non-empty wins over ``replicas``). ``host``/``port``:
    where the router listens (flags ``--host``/``--port``). Every ``refresh_interval_s`` the router
    reads each backend's ``/metrics`` (the gauges in its views); every ``health_interval_s`` it checks
    ``/health`` (a backend down gets ``can_hold=False``). A request that failed on a backend before
    anything was streamed is tried on another one up to ``retries`` times. ``request_timeout_s``: the
    most one backend answer (or the gap between two streamed chunks) may take; ``start_timeout_s``: the
    most a started replica may take to listen. ``output_dir``: where started replicas write their result
    folders (``replica<i>/``); null = ``outputs/route/<date>/<time>``. ``draining``: backends (URLs or
    indices) that start drained: they take no request until ``POST /admin/undrain``."""

    replicas: int = 1
    backends: list[str] = field(default_factory=list)
    host: str = "127.0.0.1"
    port: int = 8100
    refresh_interval_s: float = 0.5
    health_interval_s: float = 1.0
    retries: int = 1
    request_timeout_s: float = 300.0
    start_timeout_s: float = 180.0
    output_dir: Optional[str] = None
    draining: list[str] = field(default_factory=list)


@dataclass
class ServelabConfig:
    """Top-level keys; groups are filled by the defaults list in ``conf/config.yaml``. The plugin
    kinds' groups (``scheduler``, ``allocator`` ...) are added from the kinds table by :func:`schema`."""

    hardware: HardwareConfig = MISSING
    model: ModelConfig = MISSING
    workload: Any = MISSING
    backend: BackendConfig = MISSING
    logger: LoggerConfig = MISSING
    # a power of two 1..256, or "auto" (servelab.assemble.block_size); checked by validate. Typed Any: OmegaConf 2.3
    # has no int | str; ``help_type`` is what ``servelab --help`` shows
    block_size: Any = field(default=16, metadata={"help_type": "int | auto"})
    seed: int = 0
    max_num_seqs: int = 64
    max_num_batched_tokens: int = 2048
    num_kv_blocks: Optional[int] = None
    max_model_len: int = 2048
    chunked_prefill: bool = True
    non_chunked_schedule: NonChunkedSchedule = NonChunkedSchedule.prefill_first
    num_scheduler_steps: int = 1
    kv_cache_dtype: KVCacheDType = KVCacheDType.auto
    attention_backend: AttentionBackend = AttentionBackend.auto
    tensor_parallel_size: int = 1
    expert_parallel_size: int = 1  # a MoE layer's experts split this many ways over the tensor-parallel ranks
    # backend=sim, a MoE model with expert_parallel_size > 1: attention data-parallel over the
    # tensor_parallel_size ranks (each its own sequences and KV, weights replicated), the experts EP
    data_parallel_attention: bool = False
    pipeline_parallel_size: int = 1  # the layers split into this many stages, tensor_parallel_size ranks each
    clock: Clock = Clock.auto
    slo: SLOConfig = field(default_factory=SLOConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    fairness: FairnessConfig = field(default_factory=FairnessConfig)
    results: ResultsConfig = field(default_factory=ResultsConfig)
    debug: DebugConfig = field(default_factory=DebugConfig)
    sim: SimConfig = field(default_factory=SimConfig)
    frontend: FrontendConfig = MISSING
    engine: EngineConfig = MISSING  # the serving engine the simulator prices (conf/engine/*.yaml)
    kv_tiers: KVTiersConfig = MISSING
    eval_ppl: EvalPPLConfig = field(default_factory=EvalPPLConfig)
    serve: ServeConfig = field(default_factory=ServeConfig)
    route: RouteConfig = field(default_factory=RouteConfig)
    bench: BenchConfig = field(default_factory=BenchConfig)
    progress: bool = True
    report: bool = False  # write report.html (servelab report) beside the results at the end of the run
    strict_requests: bool = False  # a request the engine would reject is a start-up error (not a rejection)
