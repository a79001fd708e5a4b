"""The fixed traffic ``servelab grade`` scores plugins on (``servelab.kit.grade_workloads`` pairs each
with the engine settings it runs under), and ``workload=grade workload.grade=<name>``: the same
requests in any run.

Each generator is a seeded function of nothing: the same requests on every machine and every call.
Token ids are placeholders below :data:`VOCAB` (the simulator never reads them; equal ids are equal
prefixes). Changing one changes every grade: add, don't edit.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from servelab.core.errors import WorkloadError
from servelab.core.request import Request

VOCAB = 32_000  # placeholder token ids: the simulator never reads them


def _request(rng: np.random.Generator, rid: str, prompt: int, output: int, arrival: float,
             ttft_ms: float, tpot_ms: float, priority: int = 0, client_id: str | None = None,
             slo_class: str | None = None) -> Request:
    tokens = tuple(int(t) for t in rng.integers(1, VOCAB, size=prompt))
    return Request(rid, tokens, output, arrival_time=arrival, priority=priority,
                   ttft_slo_ms=ttft_ms, tpot_slo_ms=tpot_ms, client_id=client_id, slo_class=slo_class)


def chat_burst() -> list[Request]:
    """Three bursts of 48 requests 3 s apart: 70% interactive (TTFT 400 ms, TPOT 40 ms,
    priority 0), 30% batch (TTFT 5 s, TPOT 150 ms, priority 1)."""
    rng = np.random.default_rng(1)
    out = []
    for burst in range(3):
        for i in range(48):
            interactive = rng.random() < 0.7
            out.append(_request(rng, f"b{burst}-{i}", int(rng.integers(64, 768)), int(rng.integers(32, 256)),
                                3.0 * burst + float(rng.uniform(0, 0.2)),
                                400.0 if interactive else 5000.0, 40.0 if interactive else 150.0,
                                0 if interactive else 1, slo_class="interactive" if interactive else "batch"))
    return out


def long_prompts() -> list[Request]:
    """48 long prompts (1-6k tokens) with short answers, Poisson at 12/s: prefill-bound."""
    rng = np.random.default_rng(2)
    arrivals = np.cumsum(rng.exponential(1 / 12.0, size=48))
    return [_request(rng, f"l{i}", int(rng.integers(1024, 6144)), int(rng.integers(16, 64)), float(arrivals[i]),
                     2000.0, 100.0) for i in range(48)]


def tight_pool() -> list[Request]:
    """64 requests in the first second into a 256-block pool (4,096 tokens): preemption-bound."""
    rng = np.random.default_rng(3)
    return [_request(rng, f"t{i}", int(rng.integers(128, 640)), int(rng.integers(64, 320)), float(rng.uniform(0, 1.0)),
                     4000.0, 60.0) for i in range(64)]


def fairness_flood() -> list[Request]:
    """Two clients over 20 s: ``steady`` sends 2 requests/s (Poisson; 256-768 prompt tokens,
    64-192 output), ``flood`` sends 30/s for the first 10 s (the same lengths): far more than the
    server can do, so both are backlogged for most of the run. Both have TTFT 2 s, TPOT 100 ms."""
    rng = np.random.default_rng(4)
    out = []
    for client, rate, until in (("steady", 2.0, 20.0), ("flood", 30.0, 10.0)):
        arrivals = np.cumsum(rng.exponential(1 / rate, size=int(rate * until * 1.5)))
        for i, t in enumerate(arrivals[arrivals < until]):
            out.append(_request(rng, f"{client}-{i}", int(rng.integers(256, 768)), int(rng.integers(64, 192)),
                                float(t), 2000.0, 100.0, client_id=client))
    return sorted(out, key=lambda r: r.arrival_time)


def prefix_thrash() -> list[Request]:
    """Shared-prefix traffic through a pool that cannot keep it, for evictors. 160 conversations
    start at 4/s (Poisson); each opens with one of 12 documents (512-3k tokens, Zipf(1.1)
    popularity) and has 2-6 turns an exponential 4 s apart, each turn's prompt repeating the
    conversation so far (user turns 32-256 tokens, replies 64-256, the reply's length the turn's
    output). Among them one-off long prompts (2-6k tokens, 16-64 output) arrive at 1.5/s and are
    never reused: what pushes the hot prefixes out of a recency-only cache. TTFT 1 s, TPOT 100 ms.
    An unbounded cache would serve 75% of the prompt tokens."""
    rng = np.random.default_rng(5)

    def tokens(n: int) -> tuple[int, ...]:
        return tuple(int(t) for t in rng.integers(1, VOCAB, size=n))

    popularity = 1.0 / np.arange(1, 13) ** 1.1
    documents = [tokens(int(rng.integers(512, 3072))) for _ in range(12)]
    starts = np.cumsum(rng.exponential(1 / 4.0, size=160))
    out = []
    for k, start in enumerate(starts):
        history, arrival = documents[int(rng.choice(12, p=popularity / popularity.sum()))], float(start)
        for turn in range(int(rng.integers(2, 7))):
            history += tokens(int(rng.integers(32, 256)))
            output = int(rng.integers(64, 256))
            out.append(Request(f"c{k}-{turn}", history, output, arrival_time=arrival, ttft_slo_ms=1000.0,
                               tpot_slo_ms=100.0))
            history += tokens(output)
            arrival += float(rng.exponential(4.0))
    scans = np.cumsum(rng.exponential(1 / 1.5, size=int(1.5 * starts[-1] * 1.5)))
    for i, t in enumerate(scans[scans < starts[-1]]):
        out.append(_request(rng, f"s{i}", int(rng.integers(2048, 6144)), int(rng.integers(16, 64)), float(t),
                            1000.0, 100.0))
    return sorted(out, key=lambda r: r.arrival_time)


def cluster_chat() -> list[Request]:
    """Multi-turn chat through 4 replicas, for routers. 200 conversations start at 20/s (Poisson);
    each opens with one of 8 system prompts (512-2k tokens, Zipf(1) popularity) and has 2-5 turns an
    exponential 1 s apart, each turn's prompt repeating the conversation so far (user turns 32-256
    tokens, replies 64-256, the reply's length the turn's output); each request's ``client_id`` is
    its conversation (``session-<k>``). The replicas are busy about 90% of the run and queue: placing
    for cache hits (the conversation's replica) and placing for load pull apart. TTFT 1 s, TPOT 100 ms."""
    rng = np.random.default_rng(6)

    def tokens(n: int) -> tuple[int, ...]:
        return tuple(int(t) for t in rng.integers(1, VOCAB, size=n))

    popularity = 1.0 / np.arange(1, 9) ** 1.0
    systems = [tokens(int(rng.integers(512, 2048))) for _ in range(8)]
    starts = np.cumsum(rng.exponential(1 / 20.0, size=200))
    out = []
    for k, start in enumerate(starts):
        history, arrival = systems[int(rng.choice(8, p=popularity / popularity.sum()))], float(start)
        for turn in range(int(rng.integers(2, 6))):
            history += tokens(int(rng.integers(32, 256)))
            output = int(rng.integers(64, 256))
            out.append(Request(f"s{k}-{turn}", history, output, arrival_time=arrival, ttft_slo_ms=1000.0,
                               tpot_slo_ms=100.0, client_id=f"session-{k}"))
            history += tokens(output)
            arrival += float(rng.exponential(1.0))
    return sorted(out, key=lambda r: r.arrival_time)


def cluster_drift() -> list[Request]:
    """Heavy-tailed answers through 4 replicas with small KV pools, for migration policies. 320 requests
    at 14/s (Poisson), prompts 128-1024 tokens, outputs lognormal (median 96, sigma 1.3, 16-3000 tokens;
    the length is unknown to a router, so loads placed evenly drift apart), one in ten of priority -1
    (urgent; the rest 0). TTFT 1 s, TPOT 100 ms."""
    rng = np.random.default_rng(7)
    starts = np.cumsum(rng.exponential(1 / 14.0, size=320))
    out = []
    for k, start in enumerate(starts):
        prompt = tuple(int(t) for t in rng.integers(1, VOCAB, size=int(rng.integers(128, 1025))))
        output = int(np.clip(rng.lognormal(np.log(96), 1.3), 16, 3000))
        priority = -1 if rng.random() < 0.1 else 0
        out.append(Request(f"d{k}", prompt, output, arrival_time=float(start), priority=priority,
                           ttft_slo_ms=1000.0, tpot_slo_ms=100.0))
    return out


#: ``workload.grade=<name>`` -> the generator (what each grade workload's ``requests`` is).
GRADE_REQUESTS: dict[str, Callable[[], list[Request]]] = {
    f.__name__: f for f in (chat_burst, long_prompts, tight_pool, fairness_flood, prefix_thrash, cluster_chat,
                            cluster_drift)}


def grade_requests(cfg, vocab_size: int, max_model_len: int) -> list[Request]:
    """``workload=grade``: the requests of generator ``cfg.grade``, with arrivals as generated (the
    run's ``workload.time_scale`` applies as to any workload). A model whose vocabulary is smaller than
    :data:`VOCAB` gets each placeholder id modulo its size (equal prompts stay equal)."""
    name = cfg.grade
    if name not in GRADE_REQUESTS:
        raise WorkloadError(f"workload.grade={name!r} is not one of {', '.join(GRADE_REQUESTS)}")
    requests = GRADE_REQUESTS[name]()
    if vocab_size >= VOCAB:
        return requests
    return [_remapped(r, vocab_size) for r in requests]


def _remapped(request: Request, vocab_size: int) -> Request:
    from dataclasses import replace  # noqa: PLC0415 - only for a small model

    return replace(request, prompt_token_ids=tuple(t % vocab_size for t in request.prompt_token_ids))
