"""The ``workload=`` options' schemas (synthetic, jsonl, text prompts, corpus, traces, hash ids, chat
sessions) and the enums their keys take."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Optional

from omegaconf import MISSING


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
class SloClassConfig:
    """One entry of ``workload.slo_classes`` (``servelab.workloads.slo_classes``): a class of requests
    with their own targets. Each request's class is drawn with probability share / sum of shares (the
    workload's seed, its own stream); a request then carries ``ttft_ms`` / ``tpot_ms`` as its own
    ``ttft_slo_ms`` / ``tpot_slo_ms`` (null: the run's ``slo.*``), ``priority`` (null: 0) and ``name``
    (``summary.json``'s ``slo_classes`` reports each class)."""

    name: str = ""
    share: Optional[float] = None  # null = 1
    ttft_ms: Optional[float] = None
    tpot_ms: Optional[float] = None
    priority: Optional[int] = None


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
    slo_classes: Optional[list[SloClassConfig]] = None  # null = no classes (targets from slo.* alone)


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
class GradeWorkloadConfig:
    """The traffic of a ``servelab grade`` workload (``servelab.workloads.grade``): ``grade`` names its
    generator (``chat_burst``, ``long_prompts``, ``tight_pool``, ``fairness_flood``, ``prefix_thrash``,
    ``cluster_chat``); fixed, seeded requests. ``experiment=grade_<workload>`` runs one with the engine
    settings ``grade`` gives it."""

    name: str = "grade"
    grade: str = MISSING
    time_scale: float = 1.0


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
