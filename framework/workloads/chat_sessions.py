"""Synthetic multi-turn chat with shared system prompts (``workload=chat_sessions``).

The traffic prefix caching is for: many conversations, each opening with one of a few system
prompts (popularity Zipf(``system_zipf``): a handful are very common), and each turn's prompt
repeating the whole conversation so far. Turn ``t`` of a session sends::

    system prompt + user_1 + reply_1 + ... + user_{t-1} + reply_{t-1} + user_t

and generates ``output_len`` tokens (``ignore_eos``). ``reply_i`` are token ids drawn with the
workload (what the client stored as the assistant's answer); the model's own output differs on
the real engine and is placeholders in the simulator, so a later turn reuses the cached blocks of
the system prompt and the earlier *prompts* of its session, not of the replies the engine
generated (the same holds for the Mooncake trace's hash ids). Arrivals are open loop: sessions
start as a Poisson stream at ``session_rate``; each next turn arrives an exponential
``think_time_s`` (mean) after the previous one arrived. Every request's ``client_id`` is its
session (``session-<k>``), so session-sticky routing and the fairness figures can see
conversations. A session whose next turn would not fit ``max_model_len`` ends there (counted in
the log line).
"""

from __future__ import annotations

import logging

import numpy as np

from servelab.core.errors import WorkloadError
from servelab.core.request import Request
from servelab.workloads.lengths import draw_lengths

log = logging.getLogger(__name__)


def chat_session_requests(cfg, vocab_size: int, max_model_len: int) -> list[Request]:
    """The workload's turns, ordered by arrival (ties by session, then turn)."""
    _check(cfg)
    rng = np.random.default_rng([int(cfg.seed), 0xC4A7])
    n = cfg.num_sessions
    popularity = 1.0 / np.arange(1, cfg.num_system_prompts + 1) ** cfg.system_zipf
    system_of = rng.choice(cfg.num_system_prompts, size=n, p=popularity / popularity.sum())
    system_lens = draw_lengths(rng, cfg.system_prompt_len, cfg.num_system_prompts, "system_prompt_len")
    systems = [_tokens(rng, int(length), vocab_size) for length in system_lens]
    turns = draw_lengths(rng, cfg.turns, n, "turns")
    starts = np.cumsum(rng.exponential(1.0 / cfg.session_rate, size=n)) if n else np.zeros(0)
    requests, ended_early = [], 0
    for k in range(n):
        history, arrival = list(systems[system_of[k]]), float(starts[k])
        user_lens = draw_lengths(rng, cfg.user_len, int(turns[k]), "user_len")
        output_lens = draw_lengths(rng, cfg.output_len, int(turns[k]), "output_len")
        for t in range(int(turns[k])):
            history.extend(_tokens(rng, int(user_lens[t]), vocab_size))
            if len(history) + int(output_lens[t]) > max_model_len:
                ended_early += 1
                break
            requests.append(Request(id=f"chat-{k}-{t}", prompt_token_ids=tuple(history),
                                    max_tokens=int(output_lens[t]), arrival_time=arrival, ignore_eos=True,
                                    client_id=f"session-{k}"))
            history.extend(_tokens(rng, int(output_lens[t]), vocab_size))
            arrival += float(rng.exponential(cfg.think_time_s))
    requests.sort(key=lambda r: r.arrival_time)  # stable: ties keep session, then turn order
    log.info("chat_sessions: %d sessions, %d turns over %d system prompts (zipf %g); %d sessions ended early "
             "at max_model_len=%d", n, len(requests), cfg.num_system_prompts, cfg.system_zipf, ended_early,
             max_model_len)
    return requests


def _check(cfg) -> None:
    for key in ("num_sessions", "num_system_prompts"):
        if cfg[key] < (0 if key == "num_sessions" else 1):
            raise WorkloadError(f"workload.{key}={cfg[key]} must be >= {0 if key == 'num_sessions' else 1}")
    for key in ("session_rate", "think_time_s"):
        if not cfg[key] > 0:
            raise WorkloadError(f"workload.{key}={cfg[key]} must be > 0")
    if cfg.system_zipf < 0:
        raise WorkloadError(f"workload.system_zipf={cfg.system_zipf} must be >= 0 (0 = equally popular)")


def _tokens(rng: np.random.Generator, length: int, vocab_size: int) -> list[int]:
    return rng.integers(0, vocab_size, size=length).tolist()
