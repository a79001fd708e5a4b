"""Workloads: synthetic, a jsonl file of requests, a CSV request trace, a hash-id trace
(``workload_hash_ids``), or text prompts (``workload_text``: a prompts file, the held-out
corpus), turned into Requests.

Trace transformations (sample N rows, scale lengths, clip to max_model_len, compress time) are
explicit config values and every one applied is logged; no row is dropped silently.
"""

from __future__ import annotations

import csv
import json
import logging
from datetime import datetime
from pathlib import Path
from typing import cast

import numpy as np

from servelab.core.errors import ServelabError, WorkloadError  # WorkloadError: also importable from here, as before
from servelab.core.packaged import trace_path
from servelab.core.request import Request, SamplingParams, drawn_from
from servelab.workloads.clients import (client_ids, client_rng, draw_clients, parse_clients,
                                        rates_unless_all_at_once, summed_rate)
from servelab.workloads.chat_sessions import chat_session_requests
from servelab.workloads.grade import grade_requests
from servelab.workloads.hash_ids import hash_ids_requests
from servelab.workloads.lazy_prompts import LazyPrompt, PromptDraws, token_objects
from servelab.workloads.lengths import draw_lengths
from servelab.workloads.slo_classes import draw_slo_classes, parse_slo_classes
from servelab.workloads.text import CheckpointText
from servelab.workloads.text_prompts import corpus_requests, prompts_requests

log = logging.getLogger(__name__)


def build_requests(cfg, vocab_size: int, max_model_len: int, text=None) -> list[Request]:
    """The requests of workload config ``cfg`` (its ``name`` picks the kind). ``text`` is the
    checkpoint's :class:`~servelab.workloads.text.CheckpointText` (text prompts need its tokenizer)."""
    text = text if text is not None else CheckpointText(None)
    kinds = {"synthetic": synthetic_requests, "jsonl": lambda c, v, m: jsonl_requests(c, v, m, text),
             "trace": trace_requests, "hash_ids": hash_ids_requests, "chat_sessions": chat_session_requests,
             "grade": grade_requests,
             "prompts": lambda c, v, m: prompts_requests(c, text), "corpus": lambda c, v, m: corpus_requests(c, text)}
    if cfg.name not in kinds:
        raise WorkloadError(f"workload.name={cfg.name!r} is not one of {sorted(kinds)}")
    requests = kinds[cfg.name](cfg, vocab_size, max_model_len)
    if not len(requests):  # a run of nothing would report "completed" with every figure n/a
        raise WorkloadError(no_requests_message(cfg, max_model_len))
    return requests


def no_requests_message(cfg, max_model_len: int) -> str:
    """The one line refusing workload config ``cfg`` that made no request: the key or file to blame."""
    for key in ("num_requests", "num_sessions"):
        if cfg.get(key) == 0:
            return f"workload.{key}=0: the workload has no requests; set workload.{key}>=1"
    if cfg.get("path") is None:  # chat_sessions: every session ended before its first turn
        return (f"workload={cfg.name}: no session's first turn fits max_model_len={max_model_len}; shorten "
                f"workload.system_prompt_len / user_len / output_len (system_prompt_len.min="
                f"{cfg.system_prompt_len.min} now), e.g. workload.system_prompt_len.min=32 "
                f"workload.system_prompt_len.max=128 workload.user_len.max=64 workload.output_len.max=64")
    path = Path(cfg.path) if cfg.name == "jsonl" else trace_path(cfg.path)
    if cfg.get("start_row"):
        return f"{path}: no requests in this file from workload.start_row={cfg.start_row} on"
    return f"{path}: no requests in this file"


def _random_prompt(rng: np.random.Generator, length: int, vocab_size: int) -> tuple[int, ...]:
    # Every prompt refers to one shared int object per token id: a whole trace's prompts (22M
    # tokens for the Azure conversation trace) cost a pointer per token, not an int object each.
    # (Indexing an object array is a C loop: 3x faster than mapping __getitem__ over a list.)
    return tuple(token_objects(vocab_size)[rng.integers(0, vocab_size, size=length)].tolist())


def synthetic_requests(cfg, vocab_size: int, max_model_len: int) -> list[Request]:
    """N requests with seeded random prompts; Poisson or all-at-once arrivals. They ignore EOS.

    With ``workload.clients`` each request also gets a client (``servelab.workloads.clients``);
    a client's own ``prompt_len`` / ``output_len`` replace the workload's for its requests, drawn
    from the client's own generator, so every other request keeps its prompt. With
    ``workload.slo_classes`` each request also gets a class's targets, priority and name
    (``servelab.workloads.slo_classes``; the rest of the workload is unchanged)."""
    if cfg.num_requests < 0:
        raise WorkloadError(f"workload.num_requests={cfg.num_requests} must be >= 0")
    poisson = getattr(cfg.arrival, "value", cfg.arrival) == "poisson"
    clients = parse_clients(cfg, rates_unless_all_at_once(cfg), lengths=True)
    slo_classes = parse_slo_classes(cfg)
    rng = np.random.default_rng(cfg.seed)
    n = cfg.num_requests
    prompts = draw_lengths(rng, cfg.prompt_len, n, "prompt_len")
    outputs = draw_lengths(rng, cfg.output_len, n, "output_len")
    if poisson:
        rate = summed_rate(clients) or cfg.rate
        if rate <= 0:
            raise WorkloadError(f"workload.rate={cfg.rate} must be > 0 for Poisson arrivals")
        arrivals = np.cumsum(rng.exponential(1.0 / rate, size=n))  # the same draws whatever the rate
        arrivals -= arrivals[0] if n else 0
    else:
        arrivals = np.zeros(n)
    owners = draw_clients(clients, n, cfg.seed)
    ids = client_ids(clients, owners, n)
    own_prompt = _client_lengths(clients, owners, cfg.seed, prompts, outputs)
    drawn_classes = draw_slo_classes(slo_classes, n, cfg.seed)
    # prompts: drawn in request order from rng (as it is now), a client with its own prompt lengths
    # replacing its requests' with draws from its own generator; made as they are read
    own_len = own_prompt if own_prompt is not None else np.full(n, -1)  # -1: the workload's length
    owner = owners if owners is not None else np.zeros(n, dtype=np.int64)
    own = sorted({int(owner[i]) for i in np.flatnonzero(own_len >= 0)})
    generators = [rng] + [client_rng(cfg.seed, k, 1) for k in own]
    slot = {k: 1 + j for j, k in enumerate(own)}

    def draws(i: int) -> tuple[tuple[int, int], ...]:
        if own_len[i] >= 0:
            return (0, int(prompts[i])), (slot[int(owner[i])], int(own_len[i]))
        return ((0, int(prompts[i])),)

    prompt_draws = PromptDraws(generators, draws, vocab_size)

    def generate():  # the same requests on every pass; no token is drawn until one is read
        for i in range(n):
            length = int(own_len[i]) if own_len[i] >= 0 else int(prompts[i])
            slo = {} if drawn_classes is None else slo_classes[int(drawn_classes[i])].request_fields()
            yield drawn_from(Request(id=f"req-{i}", prompt_token_ids=LazyPrompt(prompt_draws, i, length),  # type: ignore[arg-type]
                                     max_tokens=int(outputs[i]), arrival_time=float(arrivals[i]), ignore_eos=True,
                                     client_id=ids[i], **slo),
                             vocab_size)

    return cast("list[Request]", InArrivalOrder(n, generate))  # sized, iterable and indexable like the list


def _client_lengths(clients, owners, seed: int, prompts: np.ndarray, outputs: np.ndarray) -> np.ndarray | None:
    """Apply the clients' own ``output_len`` to ``outputs`` (in place); return each request's own
    prompt length (-1: the workload's), or None when no client has one."""
    own_prompt = None
    for k, client in enumerate(clients):
        if client.prompt_len is None and client.output_len is None:
            continue
        mine = owners == k
        rng = client_rng(seed, k, 2)
        if client.prompt_len is not None:
            if own_prompt is None:
                own_prompt = np.full(len(prompts), -1)
            own_prompt[mine] = draw_lengths(rng, client.prompt_len, int(mine.sum()), f"clients[{k}].prompt_len")
        if client.output_len is not None:
            outputs[mine] = draw_lengths(rng, client.output_len, int(mine.sum()), f"clients[{k}].output_len")
    return own_prompt


class InArrivalOrder:
    """Requests made one at a time, in arrival order, each time it is iterated (once per run):
    a 100,000-request workload never holds more than the requests that have arrived."""

    in_arrival_order = True

    def __init__(self, count: int, generate) -> None:
        self.count, self._generate = count, generate

    def __len__(self) -> int:
        return self.count

    def __iter__(self):
        return self._generate()

    def __getitem__(self, index):
        return list(self)[index]


_JSONL_KEYS = {"id", "prompt", "prompt_token_ids", "prompt_len", "max_tokens", "arrival_time", "priority", "ttft_slo_ms",
               "tpot_slo_ms", "ignore_eos", "temperature", "top_p", "top_k", "seed", "cache_salt", "client_id", "slo_class"}


def jsonl_requests(cfg, vocab_size: int, max_model_len: int, text=None) -> list[Request]:
    """Requests from a jsonl file; they stop at ``max_tokens``. A ``prompt`` string is tokenized
    with the checkpoint's tokenizer (``text``) and stops at EOS unless ``ignore_eos: true``; token
    ids (``prompt_token_ids``, or seeded random ones for a ``prompt_len``) ignore EOS unless
    ``ignore_eos: false``."""
    path = Path(cfg.path)
    if not path.is_file():
        raise WorkloadError(f"workload.path={str(path)!r}: no such file")
    rng = np.random.default_rng(cfg.seed)
    requests: list[Request] = []
    ids: set[str] = set()
    with path.open() as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise WorkloadError(f"{where}: not valid JSON ({exc.msg})") from None
            requests.append(_jsonl_request(obj, where, len(requests), rng, vocab_size, text))
            if requests[-1].id in ids:
                raise WorkloadError(f"{where}: duplicate id {requests[-1].id!r}")
            ids.add(requests[-1].id)
    return requests


def _jsonl_request(obj, where: str, index: int, rng, vocab_size: int, text=None) -> Request:
    if not isinstance(obj, dict):
        raise WorkloadError(f"{where}: expected a JSON object, got {type(obj).__name__}")
    unknown = set(obj) - _JSONL_KEYS
    if unknown:
        raise WorkloadError(f"{where}: unknown keys {sorted(unknown)}; allowed: {sorted(_JSONL_KEYS)}")
    if "max_tokens" not in obj:
        raise WorkloadError(f"{where}: missing 'max_tokens'")
    if "prompt" in obj and ("prompt_token_ids" in obj or "prompt_len" in obj):
        other = "prompt_token_ids" if "prompt_token_ids" in obj else "prompt_len"
        raise WorkloadError(f"{where}: has both 'prompt' and {other!r}; give one of them")
    try:
        if "prompt" in obj:
            if not isinstance(obj["prompt"], str):
                raise WorkloadError(f"{where}: 'prompt' must be a string (token ids go in 'prompt_token_ids')")
            if text is None:
                text = CheckpointText(None)
            prompt = text.encode(obj["prompt"], where)
        elif "prompt_token_ids" in obj:
            tokens = obj["prompt_token_ids"]
            if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
                raise WorkloadError(f"{where}: 'prompt_token_ids' must be a list of integers")
            prompt = tuple(tokens)
        elif "prompt_len" in obj:
            prompt = _random_prompt(rng, _length(obj["prompt_len"], "prompt_len", where), vocab_size)
        else:
            raise WorkloadError(f"{where}: needs 'prompt', 'prompt_token_ids' or 'prompt_len'")
        sampling = SamplingParams(float(obj.get("temperature", 0.0)), float(obj.get("top_p", 1.0)),
                                  int(obj.get("top_k", 0)), obj.get("seed"))
        return Request(
            id=str(obj.get("id", f"req-{index}")), prompt_token_ids=prompt,
            max_tokens=_length(obj["max_tokens"], "max_tokens", where),
            arrival_time=float(obj.get("arrival_time") or 0.0), sampling=sampling,
            ignore_eos=bool(obj.get("ignore_eos", "prompt" not in obj)), priority=int(obj.get("priority", 0)),
            ttft_slo_ms=_opt_float(obj.get("ttft_slo_ms")), tpot_slo_ms=_opt_float(obj.get("tpot_slo_ms")),
            cache_salt=_opt_salt(obj.get("cache_salt"), where), client_id=_opt_client(obj.get("client_id"), where),
            slo_class=_opt_label(obj.get("slo_class"), where, "slo_class"))
    except (TypeError, ValueError) as exc:
        if isinstance(exc, ServelabError):
            raise
        raise WorkloadError(f"{where}: bad value ({exc})") from None


def _length(value, key: str, where: str) -> int:
    """A token count of a jsonl request: an integer >= 1 (a negative or zero one is refused, not run)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not float(value).is_integer():
        raise WorkloadError(f"{where}: {key}={json.dumps(value)} must be a whole number of tokens >= 1")
    if value < 1:
        raise WorkloadError(f"{where}: {key}={int(value)} must be >= 1")
    return int(value)


def _opt_float(v):
    return None if v is None else float(v)


def _opt_salt(v, where: str) -> str | None:
    if v is not None and not isinstance(v, str):
        raise WorkloadError(f"{where}: 'cache_salt' must be a string, got {type(v).__name__}")
    return v


def _opt_label(v, where: str, key: str) -> str | None:
    if v is not None and not (isinstance(v, str) and v):
        raise WorkloadError(f"{where}: {key} must be a non-empty string, got {json.dumps(v)}")
    return v


def _opt_client(v, where: str) -> str | None:
    if v is not None and not isinstance(v, str):
        raise WorkloadError(f"{where}: client_id must be a string, got {json.dumps(v)} ({type(v).__name__})")
    if v == "":
        raise WorkloadError(f"{where}: client_id is empty (leave it out for the anonymous client)")
    return v


_TRACE_FORMATS = {
    # columns: (arrival, prompt, output); arrival None = no timestamps in the trace
    "azure": ("TIMESTAMP", "ContextTokens", "GeneratedTokens"),
    "arrived_at": ("arrived_at", "num_prefill_tokens", "num_decode_tokens"),
    "lengths": (None, "num_prefill_tokens", "num_decode_tokens"),
}


def trace_requests(cfg, vocab_size: int, max_model_len: int) -> list[Request]:
    """Replay a CSV trace (a file, or a packaged trace's name such as ``azure_conv``) with the
    configured, logged transformations; ``workload.clients`` shares assign each row a client."""
    clients = parse_clients(cfg, "workload=trace replays the trace's arrival times")
    path = trace_path(cfg.path)
    with path.open(newline="") as fh:
        reader = csv.DictReader(fh)
        header = reader.fieldnames or []
        fmt = next((f for f, cols in _TRACE_FORMATS.items() if all(c in header for c in cols if c)), None)
        if fmt is None:
            raise WorkloadError(f"{path}: unrecognised trace columns {header}; expected one of "
                                f"{[list(c for c in cols if c) for cols in _TRACE_FORMATS.values()]}")
        rows = list(reader)
    a_col, p_col, o_col = _TRACE_FORMATS[fmt]
    total = len(rows)
    rng = np.random.default_rng(cfg.seed)
    rows = rows[cfg.start_row:]
    lines = list(range(cfg.start_row + 2, cfg.start_row + 2 + len(rows)))  # each row's line in the file (header: 1)
    if cfg.sample == "resample":
        return _resampled_trace(cfg, rows, (a_col, p_col, o_col), path, rng, vocab_size, max_model_len)
    if cfg.num_requests is not None and cfg.num_requests < len(rows):
        if cfg.sample == "random":
            picked = np.sort(rng.choice(len(rows), size=cfg.num_requests, replace=False))
            rows, lines = [rows[i] for i in picked], [lines[i] for i in picked]
        elif cfg.sample == "head":
            rows = rows[:cfg.num_requests]
        else:
            raise WorkloadError(f"workload.sample={cfg.sample!r} is not one of head, random, resample")
    log.info("trace %s (%s format): using %d of %d rows (start_row=%d, sample=%s)", path.name, fmt, len(rows),
             total, cfg.start_row, cfg.sample)
    arrivals = _trace_arrivals(rows, a_col, path, rng, cfg.rate)
    out_scale = cfg.output_scale if cfg.output_scale is not None else cfg.length_scale
    ids = client_ids(clients, draw_clients(clients, len(rows), cfg.seed), len(rows))
    requests, clipped = [], 0
    min_len, length_scale, start_row = cfg.min_len, cfg.length_scale, cfg.start_row  # not OmegaConf per row
    lengths: list[int] = []  # the prompts: drawn from rng in row order, as they are read
    prompt_draws = PromptDraws([rng], lambda i: ((0, lengths[i]),), vocab_size)
    for i, row in enumerate(rows):
        where = f"{path}:{lines[i]}"  # the file and line (the header is line 1), as for jsonl
        try:
            raw_prompt, raw_output = float(row[p_col]), float(row[o_col])
        except (TypeError, ValueError):
            raise WorkloadError(f"{where}: bad length values {row}") from None
        _check_trace_lengths(where, (p_col, raw_prompt), (o_col, raw_output))
        prompt_len = max(min_len, int(round(raw_prompt * length_scale)))
        output_len = max(1, int(round(raw_output * out_scale)))
        if prompt_len + output_len > max_model_len:
            clipped += 1
            prompt_len = min(prompt_len, max_model_len - 1)
            output_len = max(1, min(output_len, max_model_len - prompt_len))
        lengths.append(prompt_len)
        requests.append(drawn_from(Request(
            id=f"trace-{start_row + i}", prompt_token_ids=LazyPrompt(prompt_draws, i, prompt_len),  # type: ignore[arg-type]
            max_tokens=output_len, arrival_time=float(arrivals[i]), ignore_eos=True, client_id=ids[i]), vocab_size))
    log.info("trace %s: lengths scaled x%g (prompt) x%g (output); %d requests clipped to max_model_len=%d; "
             "time compressed x%g", path.name, cfg.length_scale, out_scale, clipped, max_model_len, cfg.time_scale)
    return requests


def _resampled_trace(cfg, rows: list[dict], cols: tuple, path: Path, rng: np.random.Generator, vocab_size: int,
                     max_model_len: int) -> list[Request]:
    """``workload.sample=resample``: ``num_requests`` requests (any number, more than the trace
    has) whose (prompt, output) lengths are rows drawn with replacement and whose gaps between
    arrivals are the trace's own gaps drawn with replacement (a bootstrap of its arrival pattern);
    made lazily, in arrival order, like a long synthetic workload."""
    a_col, p_col, o_col = cols
    n = cfg.num_requests
    if n is None or n < 1 or not rows:
        raise WorkloadError(f"workload.sample=resample needs workload.num_requests >= 1 and a non-empty trace ({path})")
    if cfg.get("clients"):
        raise WorkloadError("workload.sample=resample does not assign clients: leave workload.clients out")
    out_scale = cfg.output_scale if cfg.output_scale is not None else cfg.length_scale
    try:
        raw_prompts = np.array([float(r[p_col]) for r in rows])
        raw_outputs = np.array([float(r[o_col]) for r in rows])
    except (TypeError, ValueError):
        raise WorkloadError(f"{path}: bad length values") from None
    bad = np.flatnonzero((raw_prompts < 1) | (raw_outputs < 1))
    if bad.size:
        i = int(bad[0])
        _check_trace_lengths(f"{path}:{cfg.start_row + i + 2}", (p_col, raw_prompts[i]), (o_col, raw_outputs[i]))
    prompts = np.maximum(cfg.min_len, np.rint(raw_prompts * cfg.length_scale))
    outputs = np.maximum(1, np.rint(raw_outputs * out_scale))
    prompts = np.minimum(prompts, max_model_len - 1).astype(np.int64)
    outputs = np.maximum(1, np.minimum(outputs, max_model_len - prompts)).astype(np.int64)
    stamps = np.sort(_trace_arrivals(rows, a_col, path, rng, cfg.rate))
    gaps = np.diff(stamps) if len(stamps) > 1 else np.full(1, 1.0 / cfg.rate)
    picked = rng.integers(0, len(rows), size=n)
    arrivals = np.concatenate([[0.0], np.cumsum(rng.choice(gaps, size=n - 1))])
    log.info("trace %s: %d requests resampled from %d rows (lengths and inter-arrival gaps drawn with replacement)",
             path.name, n, len(rows))
    prompt_lens, max_tokens = prompts[picked], outputs[picked]  # per request: arrays, not tokens
    prompt_draws = PromptDraws([rng], lambda i: ((0, int(prompt_lens[i])),), vocab_size)

    def generate():  # no token is drawn until one is read
        for i in range(n):
            yield drawn_from(Request(
                id=f"trace-r{i}", prompt_token_ids=LazyPrompt(prompt_draws, i, int(prompt_lens[i])),  # type: ignore[arg-type]
                max_tokens=int(max_tokens[i]), arrival_time=float(arrivals[i]), ignore_eos=True), vocab_size)

    return cast("list[Request]", InArrivalOrder(n, generate))


def _check_trace_lengths(where: str, *columns: tuple[str, float]) -> None:
    """A trace row's token counts as the trace gives them (before any scaling): each >= 1. A row that
    says -5 or 0 tokens is a broken row, refused naming it, not run as a 1-token request."""
    for column, value in columns:
        if not value >= 1:  # NaN too
            raise WorkloadError(f"{where}: {column}={value:g} is not a length (each request needs >= 1 prompt "
                                "token and >= 1 output token); fix or drop the row")


def _trace_arrivals(rows, col, path, rng, rate) -> np.ndarray:
    if col is None:
        return np.cumsum(rng.exponential(1.0 / rate, size=len(rows))) if rows else np.zeros(0)
    if col == "TIMESTAMP":
        stamps = [_parse_timestamp(r[col], path) for r in rows]
    else:
        stamps = [float(r[col]) for r in rows]
    t = np.asarray(stamps, dtype=float)
    return t - t.min() if t.size else t


def _parse_timestamp(text: str, path) -> float:
    text = text.strip()
    if "." in text:  # Azure writes 7 fractional digits; datetime takes at most 6
        head, frac = text.split(".", 1)
        text = f"{head}.{frac[:6]}"
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        raise WorkloadError(f"{path}: unparseable TIMESTAMP {text!r}") from None
