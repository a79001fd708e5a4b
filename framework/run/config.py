"""Typed configuration: the schema Hydra composes into, and the registration of every group option.

Every group option is a dataclass in Hydra's ConfigStore, so unknown keys and wrong types are
rejected at compose time; :func:`config_error_message` turns Hydra's and OmegaConf's errors into
one line against this schema (the closest key names, a group's options), and
:func:`check_known_keys` refuses a ``+key=value`` the schema does not have. Plugin groups (scheduler, allocator,
preemption, drafter) are generated from the plugin registry: each plugin's ``Config`` dataclass
plus its ``name``, so a pip-installed plugin is selectable as ``scheduler=<name>`` with
``scheduler.<field>=...`` type-checked, without any file in this repo.
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import hashlib
import json
import re
import sys
import time
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, List, Optional, get_type_hints

from hydra.core.config_store import ConfigStore
from hydra.experimental.callback import Callback
from hydra.errors import MissingConfigException, OverrideParseException
from omegaconf import MISSING, DictConfig, ListConfig, OmegaConf

from servelab.core.errors import ConfigError
from servelab.core.executor import BackendConfig  # the backend group's schema, re-exported
from servelab.core.kinds import KINDS
from servelab.core.registry import Registry, default_registry

from servelab.core.packaged import PACKAGED_CHECKPOINTS, PACKAGED_MODELS  # re-exported

if TYPE_CHECKING:
    from servelab.core.interfaces import Plugin


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


class Arrival(enum.Enum):
    poisson = "poisson"
    all_at_once = "all_at_once"
    closed_loop = "closed_loop"  # workload.concurrency clients, each sends when its last request ended


class ThinkTimeDist(enum.Enum):
    constant = "constant"
    exponential = "exponential"  # seeded draws of mean workload.think_time_s


class LengthDist(enum.Enum):
    uniform = "uniform"
    lognormal = "lognormal"
    fixed = "fixed"


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


@dataclass
class LengthConfig:
    dist: LengthDist = LengthDist.uniform
    min: int = 16
    max: int = 256
    mean: float = 64.0  # lognormal: the median; fixed: the value (min/max then do not apply)
    sigma: float = 0.8


@dataclass
class ClientConfig:
    """One entry of ``workload.clients`` (``servelab.workloads.clients``): who sends a request.

    ``share``: the client's part of the requests (each request's client is drawn with probability
    share / sum of shares); ``rate``: its own Poisson stream (requests/s; Poisson arrivals only, not
    traces). Every client gives a share, or every client gives a rate, or none gives either (equal
    shares). ``prompt_len`` / ``output_len`` (``workload=synthetic`` only) replace the workload's
    lengths for this client's requests (a flooding client with long outputs, say)."""

    id: str = ""
    share: Optional[float] = None
    rate: Optional[float] = None
    prompt_len: Optional[LengthConfig] = None
    output_len: Optional[LengthConfig] = None


@dataclass
class SyntheticWorkload:
    name: str = "synthetic"
    num_requests: int = 256
    arrival: Arrival = Arrival.poisson
    rate: float = 8.0  # requests per second (poisson)
    concurrency: Optional[int] = None  # closed_loop: the number of clients (servelab.workloads.arrivals)
    think_time_s: float = 0.0  # closed_loop: a client's pause between its request ending and its next
    think_time_dist: ThinkTimeDist = ThinkTimeDist.constant
    prompt_len: LengthConfig = field(default_factory=lambda: LengthConfig(LengthDist.uniform, 16, 256))
    output_len: LengthConfig = field(default_factory=lambda: LengthConfig(LengthDist.uniform, 8, 128))
    seed: int = "${seed}"  # type: ignore[assignment]
    time_scale: float = 1.0
    clients: Optional[list[ClientConfig]] = None  # null = no clients (every request anonymous)


@dataclass
class JsonlWorkload:
    """One JSON object per line: ``prompt`` (text, tokenized with the checkpoint's tokenizer),
    ``prompt_token_ids`` or ``prompt_len``, ``max_tokens``, optional
    ``arrival_time`` (s), ``id``, ``priority``, ``ttft_slo_ms``, ``tpot_slo_ms``, ``ignore_eos``,
    ``temperature``/``top_p``/``top_k``/``seed``, ``cache_salt``, ``client_id`` (a string)."""

    name: str = "jsonl"
    path: str = MISSING
    seed: int = "${seed}"  # type: ignore[assignment]
    time_scale: float = 1.0


@dataclass
class TextRequestsConfig:
    """What every text-prompt workload shares: how much each request generates, how requests
    arrive, and how tokens are chosen."""

    max_tokens: int = 128
    ignore_eos: bool = False
    arrival: Arrival = Arrival.poisson
    rate: float = 1.0  # requests per second (poisson)
    concurrency: Optional[int] = None  # closed_loop: the number of clients (servelab.workloads.arrivals)
    think_time_s: float = 0.0  # closed_loop: a client's pause between its request ending and its next
    think_time_dist: ThinkTimeDist = ThinkTimeDist.constant
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int = "${seed}"  # type: ignore[assignment]
    time_scale: float = 1.0
    clients: Optional[list[ClientConfig]] = None  # null = no clients (every request anonymous)


@dataclass
class PromptsWorkload(TextRequestsConfig):
    """A plain text file, one prompt per line (``\\n`` and ``\\t`` escapes, ``\\\\`` for a backslash),
    tokenized with the checkpoint's tokenizer; blank lines are skipped. Each request generates up
    to ``max_tokens`` and stops at EOS unless ``ignore_eos``."""

    name: str = "prompts"
    path: str = MISSING
    arrival: Arrival = Arrival.all_at_once


@dataclass
class CorpusWorkload(TextRequestsConfig):
    """Prompts from the held-out split of the stdlib corpus (``servelab.workloads.corpus``): the first
    ``prefix_bytes`` bytes of a held-out document (a module header or a top-level definition,
    longer than the prefix), drawn with a seed; each generates up to ``max_tokens`` and stops at
    EOS unless ``ignore_eos``."""

    name: str = "corpus"
    num_requests: int = 100  # at rate 2/s: the default run is a ~1 min session far from saturating 2 cores
    prefix_bytes: int = 96
    rate: float = 2.0  # requests per second (poisson)


@dataclass
class TraceWorkload:
    """A CSV trace: Azure form ``TIMESTAMP,ContextTokens,GeneratedTokens``, the
    ``arrived_at,num_prefill_tokens,num_decode_tokens`` form, or lengths alone (Poisson arrivals at
    ``rate``). ``path``: a file or a packaged trace's name (``azure_conv``, ``azure_code``,
    ``sharegpt_lengths``). Transformations are explicit and logged."""

    name: str = "trace"
    path: str = MISSING  # a file or a packaged trace's name
    # null = every row; default: 200 rows on the real engine, every row in the simulator
    num_requests: Optional[int] = "${backend.trace_rows}"  # type: ignore[assignment]
    sample: str = "head"  # head | random | resample (num_requests drawn with replacement: lengths and arrival gaps)
    start_row: int = 0
    length_scale: float = 1.0
    output_scale: Optional[float] = None  # null = length_scale
    min_len: int = 1
    rate: float = 4.0  # Poisson arrivals for traces without timestamps (req/s)
    seed: int = "${seed}"  # type: ignore[assignment]
    time_scale: float = 1.0
    clients: Optional[list[ClientConfig]] = None  # shares only: a trace keeps its arrival times


@dataclass
class HashIdsWorkload:
    """A Mooncake-style jsonl trace (``timestamp`` ms, ``input_length``, ``output_length``,
    ``hash_ids``: one id per ``trace_block_tokens``-token prompt block, equal ids = equal prefixes).

    Each hash id becomes ``block_tokens`` token ids generated from (seed, id), so prompts share
    token ids exactly where the trace shares blocks; lengths scale by ``block_tokens /
    trace_block_tokens`` (the output by ``output_scale`` when set) and prompts are cut to the
    scaled ``input_length``."""

    name: str = "hash_ids"
    path: str = "mooncake_conv"  # a packaged trace's name or a file
    num_requests: Optional[int] = 200  # null = every row
    start_row: int = 0
    trace_block_tokens: int = 512
    block_tokens: int = 16
    output_scale: Optional[float] = None  # null = block_tokens / trace_block_tokens
    min_output_len: int = 1
    seed: int = "${seed}"  # type: ignore[assignment]
    time_scale: float = 1.0
    clients: Optional[list[ClientConfig]] = None  # shares only: a trace keeps its arrival times


@dataclass
class ChatSessionsWorkload:
    """Synthetic multi-turn chat (``servelab.workloads.chat_sessions``): ``num_sessions`` conversations
    starting at ``session_rate``/s, each of ``turns`` turns; each opens with one of
    ``num_system_prompts`` system prompts (Zipf ``system_zipf`` popularity) and every turn's prompt
    repeats the conversation so far; a next turn arrives ``think_time_s`` (exponential mean) later.
    Each request's ``client_id`` is its session."""

    name: str = "chat_sessions"
    num_sessions: int = 64
    session_rate: float = 1.0  # new conversations per second (Poisson)
    turns: LengthConfig = field(default_factory=lambda: LengthConfig(LengthDist.uniform, 1, 6))
    num_system_prompts: int = 8
    system_zipf: float = 1.0  # popularity of system prompt i ~ 1 / i**zipf (0 = equally popular)
    system_prompt_len: LengthConfig = field(default_factory=lambda: LengthConfig(LengthDist.uniform, 256, 1024))
    user_len: LengthConfig = field(default_factory=lambda: LengthConfig(LengthDist.lognormal, 8, 512, 64.0, 0.8))
    output_len: LengthConfig = field(default_factory=lambda: LengthConfig(LengthDist.lognormal, 8, 512, 128.0, 0.8))
    think_time_s: float = 20.0  # mean gap between a turn's arrival and the next turn's
    seed: int = "${seed}"  # type: ignore[assignment]
    time_scale: float = 1.0


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


@dataclass
class LoggerConfig:
    name: str = "wandb"
    mode: str = "offline"  # offline | online | disabled
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
    transfer streamed layer by layer during the prefill when ``overlap_kv_transfer``."""

    replicas: int = 1
    prefill_replicas: Optional[int] = None
    decode_replicas: Optional[int] = None
    prefill: PoolConfig = field(default_factory=PoolConfig)
    decode: PoolConfig = field(default_factory=PoolConfig)
    gpus_per_node: int = 8
    kv_link: KVLink = KVLink.auto
    overlap_kv_transfer: bool = True


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
    """``kv_tiers.load``: how a load from a tier meets the step that reads it (servelab.run.kv_tier_clock)."""

    overlap = "overlap"  # layer by layer behind compute: the step takes max(load, compute)
    serialize = "serialize"  # before compute: the step takes load + compute


@dataclass
class KVTierConfig:
    """One tier below the GPU (``kv_tiers.tiers[i]``, nearest first). Capacity per GPU (tensor-parallel
    rank), like ``backend.swap_space_gb``; bandwidths in GB/s (1e9 bytes) of that rank's link to the GPU;
    ``latency_us`` per transfer. ``shared``: one store for a simulated cluster's replicas, priced over the network
    (:mod:`servelab.run.kv_tier_shared`; refused on one engine and on the real backend)."""

    kind: KVTierKind = KVTierKind.host
    capacity_gib: float = 64.0
    read_gb_s: float = 25.0
    write_gb_s: float = 25.0
    latency_us: float = 10.0
    shared: bool = False


@dataclass
class KVTiersConfig:
    """``kv_tiers``: the KV cache tiers below the GPU pool (``kv_tiers=none|host|host_disk``; docs/kv-tiers.md).
    What goes down and comes back is ``kv_tier_policy=<name>`` (``none``: nothing, whatever this says)."""

    name: str = "none"
    tiers: List[KVTierConfig] = field(default_factory=list)
    load: KVTierLoad = KVTierLoad.overlap
    disk_dir: Optional[str] = None  # real engine: the folder of a disk tier's files (memory-mapped)


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
    folders (``replica<i>/``); null = ``outputs/route/<date>/<time>``."""

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


@dataclass
class ServelabConfig:
    """Top-level keys; groups are filled by the defaults list in ``conf/config.yaml``. The plugin
    kinds' groups (``scheduler``, ``allocator`` ...) are added from the kinds table by :func:`schema`."""

    hardware: HardwareConfig = MISSING
    model: ModelConfig = MISSING
    workload: Any = MISSING
    backend: BackendConfig = MISSING
    logger: LoggerConfig = MISSING
    # a power of two 1..256, or "auto" (servelab.run.block_size); checked by validate. Typed Any: OmegaConf 2.3
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
    clock: Clock = Clock.auto
    slo: SLOConfig = field(default_factory=SLOConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    fairness: FairnessConfig = field(default_factory=FairnessConfig)
    debug: DebugConfig = field(default_factory=DebugConfig)
    sim: SimConfig = field(default_factory=SimConfig)
    frontend: FrontendConfig = MISSING
    kv_tiers: KVTiersConfig = MISSING
    eval_ppl: EvalPPLConfig = field(default_factory=EvalPPLConfig)
    serve: ServeConfig = field(default_factory=ServeConfig)
    route: RouteConfig = field(default_factory=RouteConfig)
    bench: BenchConfig = field(default_factory=BenchConfig)
    progress: bool = True
    strict_requests: bool = False  # a request the engine would reject is a start-up error (not a rejection)


def plugin_node(cls: type[Plugin]) -> Any:
    """A dataclass instance: the plugin's ``Config`` fields plus ``name`` (what selects it)."""
    node_cls = dataclasses.make_dataclass(
        f"{cls.__name__}Node", [("name", str, field(default=cls.name))], bases=(cls.Config,))
    return node_cls()


def packaged_model_node(name: str) -> dict:
    """``model=tiny_code`` and friends (global, like the catalogue models): the checkpoint's path,
    ``max_model_len`` = its context, and one torch thread (these models gain nothing from a second
    one, and on a shared box a descheduled second thread stalls every op: TPOT 4 ms -> 500 ms)."""
    path = PACKAGED_CHECKPOINTS / name
    try:
        context = json.loads((path / "config.json").read_text())["max_position_embeddings"]
    except (OSError, ValueError, KeyError):
        context = 512
    return {"model": ModelConfig(name=name, path=str(path)), "max_model_len": context,
            "backend": {"num_threads": 1}}


def config_yaml_defaults() -> dict[str, str]:
    """``group -> option`` of ``conf/config.yaml``'s defaults list (``optional`` dropped)."""
    import yaml  # noqa: PLC0415 - PyYAML comes with omegaconf

    text = (resources.files("servelab.conf") / "config.yaml").read_text()
    out = {}
    for entry in yaml.safe_load(text)["defaults"]:
        if isinstance(entry, dict):
            (key, value), = entry.items()
            out[key.replace("optional ", "")] = value
    return out


def kind_defaults() -> dict[str, str]:
    """``group -> default plugin`` of every kind: ``conf/config.yaml``'s choice where it names the
    group (its place in the defaults list matters there), else the kind's own default."""
    listed = config_yaml_defaults()
    return {k.group: listed.get(k.group, k.default) for k in KINDS.values()}


def schema() -> type:
    """The config schema: :class:`ServelabConfig` plus one group per plugin kind (typed by the
    option chosen; ``backend`` keeps its shared :class:`BackendConfig` type). Kinds that
    ``conf/config.yaml`` does not list get their default here, in the schema's own defaults list,
    so a kind added to the table is selectable (``<group>=<plugin>``) without editing the YAML."""
    listed = config_yaml_defaults()
    typed = {f.name for f in dataclasses.fields(ServelabConfig)}
    kinds = [k for k in KINDS.values() if k.group not in typed]
    hints = get_type_hints(ServelabConfig)
    fields: list[tuple[str, Any, Any]] = [("defaults", List[Any], field(default_factory=lambda: [
        {k.group: k.default} for k in kinds if k.group not in listed]))]
    fields += [(k.group, Any, field(default=MISSING)) for k in kinds]
    fields += [(f.name, hints[f.name], f) for f in dataclasses.fields(ServelabConfig)]
    return dataclasses.make_dataclass("ServelabSchema", fields)


def register_configs(registry: Registry | None = None) -> None:
    """Put the schema and every group option into Hydra's ConfigStore (idempotent). A kind's option
    that ``conf/<group>/<name>.yaml`` provides (a preset such as ``backend=sim``) is left to the file."""
    registry = registry or default_registry()
    cs = ConfigStore.instance()
    cs.store(name="servelab_schema", node=schema())
    conf = resources.files("servelab.conf")
    for kind in KINDS.values():
        for name in registry.names(kind.name):
            if not (conf / kind.group / f"{name}.yaml").is_file():
                cs.store(group=kind.group, name=name, node=plugin_node(registry.get(kind.name, name)))
    cs.store(group="model", name="tiny", node=ModelConfig())
    cs.store(group="model", name="hf", node=ModelConfig(name="hf", path=MISSING))
    for name in PACKAGED_MODELS:
        cs.store(group="model", name=name, node=packaged_model_node(name), package="_global_")
    cs.store(group="workload", name="synthetic", node=SyntheticWorkload)
    cs.store(group="workload", name="jsonl", node=JsonlWorkload)
    cs.store(group="workload", name="trace", node=TraceWorkload)
    cs.store(group="workload", name="hash_ids", node=HashIdsWorkload)
    cs.store(group="workload", name="chat_sessions", node=ChatSessionsWorkload)
    cs.store(group="workload", name="prompts", node=PromptsWorkload)
    cs.store(group="workload", name="corpus", node=CorpusWorkload)
    for name, tiers in kv_tier_presets().items():  # tiers hold prefix-cache blocks: the presets turn it on
        node = {"kv_tiers": tiers, **({"allocator": {"prefix_caching": True}} if tiers.tiers else {})}
        cs.store(group="kv_tiers", name=name, node=node, package="_global_")
    cs.store(group="logger", name="wandb", node=LoggerConfig)
    cs.store(group="logger", name="none", node=LoggerConfig(name="none", mode="disabled"))


# --- one-line config errors -------------------------------------------------------------------------

_MAX_LISTED = 16  # keys of a node listed in full when no name is close; more: point at servelab --help
_COULD_NOT_OVERRIDE = re.compile(r"Could not override '([^']+)'")
_MERGING = re.compile(r"Error merging override (.+)")
_PARSING = re.compile(r"Error parsing override '(.*)'")


def _first_line(text: str) -> str:
    return next((line.strip() for line in str(text).splitlines() if line.strip()), "")


def _field_names(cls: Any) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)] if dataclasses.is_dataclass(cls) else []


def _option_label(group: str, cls: Any) -> str:
    """``scheduler=fcfs`` for a group option's dataclass (its ``name`` default), else ``group``."""
    name = next((f.default for f in dataclasses.fields(cls) if f.name == "name"), None) \
        if dataclasses.is_dataclass(cls) else None
    return f"{group}={name}" if isinstance(name, str) and name and group else group


def _option_keys(group: str) -> dict[str, list[str]]:
    """``option -> its keys`` of config group ``group`` as Hydra's ConfigStore holds it (typed
    options; YAML presets and options that set keys of other groups are left out)."""
    options = ConfigStore.instance().repo.get(group)
    if not isinstance(options, dict):
        return {}
    return {name[:-5]: [str(k) for k in entry.node.keys()] for name, entry in options.items()
            if name.endswith(".yaml") and getattr(entry, "package", None) is None
            and OmegaConf.is_dict(getattr(entry, "node", None))}


def _schema_keys(cls: Any = None, prefix: str = "") -> list[str]:
    """Every dotted key of the schema: the nested dataclass fields of :class:`ServelabConfig` and
    the keys of each group's typed options (the candidates for a key misplaced in the tree)."""
    cls = cls or ServelabConfig
    keys: list[str] = []
    hints = get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints.get(f.name, f.type)
        if dataclasses.is_dataclass(tp):
            keys += _schema_keys(tp, f"{prefix}{f.name}.")
        elif f.name != "name":
            keys.append(prefix + f.name)
    if not prefix:
        for group in ("workload", *(k.group for k in KINDS.values())):
            keys += [f"{group}.{key}" for names in _option_keys(group).values() for key in names if key != "name"]
    return list(dict.fromkeys(keys))


def unknown_key_message(key: str, node_type: Any) -> str:
    """``unknown key 'x'; did you mean 'y'?`` for ``key`` (a dotted path) under a node of
    ``node_type``: the closest field names there (difflib), else the other options of its group
    that have the field, else the closest keys anywhere in the schema, else the node's keys. Never
    a ``+key`` hint: a key outside the schema is read by nothing."""
    parent, _, leaf = key.rpartition(".")
    prefix = f"{parent}." if parent else ""
    names = [n for n in _field_names(node_type) if n != "defaults"]
    close = [prefix + c for c in difflib.get_close_matches(leaf, names, n=3, cutoff=0.6)]
    message = f"unknown key '{key}'"
    group = parent if parent and "." not in parent else ""
    here = _option_label(group, node_type) or parent
    others = [o for o, keys in _option_keys(group).items() if leaf in keys] if group else []
    if not close and others:
        return (f"{message}: {here} has no {leaf}; " + ", ".join(f"{group}={o}" for o in others)
                + (" has" if len(others) == 1 else " have") + " it")
    if not close and not parent.startswith("hydra"):
        everywhere = _schema_keys()
        by_leaf = difflib.get_close_matches(leaf, [k.rpartition(".")[2] for k in everywhere], n=3, cutoff=0.75)
        close = [k for k in everywhere if k.rpartition(".")[2] in by_leaf][:3]
    if close:
        return message + "; did you mean " + " or ".join(f"'{c}'" for c in close) + "?"
    if names == ["name"]:
        return f"{message}: {here} has no settings"
    if names and len(names) <= _MAX_LISTED:
        return f"{message}; the keys of {here}: {', '.join(n for n in names if n != 'name')}"
    return f"{message} (servelab --help lists every key)"


def unknown_keys(cfg: Any, path: str = "") -> list[tuple[str, Any]]:
    """``(dotted key, the type of its node)`` of every key of ``cfg`` (a composed config) that its
    node's dataclass does not declare: a ``+key=value`` override outside the schema, which Hydra
    adds and nothing reads. ``hydra`` and untyped nodes are not checked."""
    found: list[tuple[str, Any]] = []
    if isinstance(cfg, DictConfig):
        node_type = OmegaConf.get_type(cfg)
        fields = set(_field_names(node_type)) if dataclasses.is_dataclass(node_type) else None
        for key in map(str, cfg.keys()):
            if key == "hydra" and not path:
                continue
            name = f"{path}.{key}" if path else key
            if fields is not None and key not in fields:
                found.append((name, node_type))
                continue
            child = cfg._get_node(key)
            if isinstance(child, (DictConfig, ListConfig)) and not child._is_missing() and not child._is_none():
                found += unknown_keys(child, name)
    elif isinstance(cfg, ListConfig):
        for i in range(len(cfg)):
            item = cfg._get_node(i)
            if isinstance(item, (DictConfig, ListConfig)) and not item._is_none():
                found += unknown_keys(item, f"{path}[{i}]")
    return found


def check_known_keys(cfg: Any) -> None:
    """Raise :class:`~servelab.core.errors.ConfigError` naming the first key of ``cfg`` outside the
    schema (see :func:`unknown_keys`) and the closest names."""
    found = unknown_keys(cfg)
    if found:
        key, node_type = found[0]
        more = f" (and {len(found) - 1} more)" if len(found) > 1 else ""
        raise ConfigError(unknown_key_message(key, node_type) + more)


def config_error_message(exc: BaseException) -> str:
    """One line for an error Hydra or OmegaConf raised composing a config: an unknown key with the
    closest names, an unknown group option with the options, a bad value naming the override, an
    override that does not parse. Anything else: its first line (and its cause's)."""
    cause = exc.__cause__
    text = str(exc)
    if isinstance(exc, MissingConfigException) and exc.options is not None and exc.missing_cfg_file:
        group, _, option = str(exc.missing_cfg_file).rpartition("/")
        options = sorted(exc.options)
        close = difflib.get_close_matches(option, options, n=1, cutoff=0.6)
        hint = f" did you mean '{close[0]}'?" if close else ""
        return f"unknown {group} option '{option}';{hint} options: {', '.join(options)}"
    if isinstance(exc, OverrideParseException):
        match = _PARSING.search(text)
        what = f"'{match.group(1)}'" if match else ""
        reason = text.splitlines()[1].strip() if len(text.splitlines()) > 1 else ""
        return f"cannot parse the override {what}: {reason} (overrides are key=value)".replace(" : ", ": ")
    full_key = getattr(cause, "full_key", None)
    override = _COULD_NOT_OVERRIDE.search(text)
    if full_key and override and "not in" in str(cause):
        message = unknown_key_message(full_key, getattr(cause, "object_type", None))
        if override.group(1) != full_key:
            message = message.replace(f"'{full_key}'", f"'{full_key}' (in '{override.group(1)}')", 1)
        return message
    merging = _MERGING.search(text)
    if merging and cause is not None:
        return f"{merging.group(1).strip()}: {_first_line(str(cause))}"
    line = _first_line(text) or type(exc).__name__
    if cause is not None and _first_line(str(cause)) and _first_line(str(cause)) not in line:
        line += f": {_first_line(str(cause))}"
    return line


def experiment_names() -> list[str]:
    """``experiment=`` options: ``conf/experiment/**.yaml`` as ``name`` or ``folder/name``."""
    root = resources.files("servelab.conf") / "experiment"
    names: list[str] = []

    def walk(folder: Any, prefix: str) -> None:
        for entry in folder.iterdir():
            if entry.is_dir() and not entry.name.startswith(("_", ".")):
                walk(entry, f"{prefix}{entry.name}/")
            elif entry.name.endswith(".yaml"):
                names.append(prefix + entry.name[:-5])

    walk(root, "")
    return sorted(names)


def check_experiment_option(values: list[str]) -> None:
    """``experiment=<name>`` is optional in the defaults list, so Hydra skips a name that does not
    exist without a word: refuse it in one line with the options."""
    names = experiment_names()
    for value in values:
        if value not in names and value not in ("null", "None", ""):
            close = difflib.get_close_matches(value, names, n=1, cutoff=0.6)
            hint = f" did you mean '{close[0]}'?" if close else ""
            raise ConfigError(f"unknown experiment option '{value}';{hint} options: {', '.join(names)}")


def safe_dirname(text: Any, limit: int = 100) -> str:
    """A multirun job's folder name from its ``override_dirname``: ``/`` replaced (a path in a
    value would nest folders) and, past ``limit`` bytes, cut there plus ``-`` and an 8-hex hash of
    the whole (distinct sweeps keep distinct names; the OS limit is 255 bytes)."""
    text = str(text).replace("/", "_").replace("\\", "_")
    data = text.encode("utf-8")
    if len(data) <= limit:
        return text
    digest = hashlib.sha1(data).hexdigest()[:8]
    return f"{data[:limit].decode('utf-8', errors='ignore')}-{digest}"


ERROR_FILE = "error.txt"  # a failed run's one-line error, in its folder (servelab compare shows it)


class SweepReport(Callback):
    """``hydra.callbacks.sweep_report`` (conf/config.yaml): at the end of a multirun, in the launching
    process, one line naming the jobs that failed (each left ``error.txt`` in its folder), then
    ``results: <sweep dir>``; the sweep then exits 1."""

    failed: ClassVar[list[str]] = []  # the last sweep's failed jobs (main() exits 1 on them)

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        self.sweep_dir = Path(str(config.hydra.sweep.dir))
        self.start = time.time() - 1  # file times have coarse resolution on some file systems

    def on_multirun_end(self, config: DictConfig, **kwargs) -> None:
        def this_sweep(path: Path) -> bool:  # a folder of an earlier sweep into the same dir is not counted
            return path.is_file() and path.stat().st_mtime >= self.start

        jobs = [p for p in self.sweep_dir.iterdir() if this_sweep(p / ".hydra" / "hydra.yaml")] \
            if self.sweep_dir.is_dir() else []
        failed = sorted(p.name for p in jobs if this_sweep(p / ERROR_FILE))
        SweepReport.failed = failed
        if failed:
            print(f"servelab: error: {len(failed)} of {max(len(jobs), len(failed))} jobs failed: {', '.join(failed)} "
                  f"(each one's error is in its {ERROR_FILE}); the others' results are kept", file=sys.stderr,
                  flush=True)
        print(f"results: {self.sweep_dir}", flush=True)


# ``hydra.sweep.subdir`` in conf/config.yaml; registered on import, so a launcher's worker process
# (which imports this module with the task function) resolves it too.
OmegaConf.register_new_resolver("servelab_dirname", safe_dirname, replace=True)
