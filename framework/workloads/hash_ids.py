"""Prompts that share prefixes exactly where a Mooncake-style trace says they do (``hash_ids``).

Each trace block id maps to ``block_tokens`` token ids drawn from a generator seeded by
(workload seed, block id), so two requests listing the same leading ids get identical leading
tokens. Every transformation (rows used, length scale, clipping to ``max_model_len``) is logged.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np

from servelab.core.errors import WorkloadError
from servelab.core.packaged import trace_path
from servelab.core.request import Request
from servelab.workloads.clients import client_ids, draw_clients, parse_clients

log = logging.getLogger(__name__)


def block_token_ids(seed: int, block_id: int, block_tokens: int, vocab_size: int) -> list[int]:
    """The token ids standing for trace block ``block_id`` (deterministic in seed and id)."""
    rng = np.random.default_rng([seed, block_id])
    return rng.integers(0, vocab_size, size=block_tokens).tolist()


def hash_ids_requests(cfg, vocab_size: int, max_model_len: int) -> list[Request]:
    """The trace's requests; ``workload.clients`` shares assign each row a client."""
    clients = parse_clients(cfg, "workload=hash_ids replays the trace's arrival times")
    path = trace_path(cfg.path)  # a file, or a packaged trace's name (mooncake_conv)
    if cfg.block_tokens < 1 or cfg.trace_block_tokens < 1:
        raise WorkloadError(f"workload.block_tokens={cfg.block_tokens} and workload.trace_block_tokens="
                            f"{cfg.trace_block_tokens} must be >= 1")
    scale = cfg.block_tokens / cfg.trace_block_tokens
    out_scale = cfg.output_scale if cfg.output_scale is not None else scale
    rows = _read_rows(path, cfg.start_row, cfg.num_requests)
    owners = client_ids(clients, draw_clients(clients, len(rows), cfg.seed), len(rows))
    blocks: dict[int, list[int]] = {}
    seed, block_tokens = int(cfg.seed), int(cfg.block_tokens)  # read once: an OmegaConf read per block dominated
    requests, clipped = [], 0
    t0 = rows[0][1]["timestamp"] if rows else 0
    for i, (lineno, row) in enumerate(rows):
        where = f"{path}:{lineno}"
        try:
            ids, input_len = [int(h) for h in row["hash_ids"]], int(row["input_length"])
            prompt_len = max(1, round(input_len * scale))
            output_len = max(cfg.min_output_len, round(int(row["output_length"]) * out_scale))
            arrival = (float(row["timestamp"]) - t0) / 1e3
        except (KeyError, TypeError, ValueError) as exc:
            raise WorkloadError(f"{where}: needs timestamp, input_length, output_length, hash_ids ({exc})") from None
        for key in ("input_length", "output_length"):
            if int(row[key]) < 1:  # a broken row, not a 1-token request
                raise WorkloadError(f"{where}: {key}={int(row[key])} is not a length (each request needs >= 1 prompt "
                                    "token and >= 1 output token); fix or drop the row")
        if len(ids) * block_tokens < prompt_len:
            raise WorkloadError(f"{where}: {len(ids)} hash_ids x {block_tokens} tokens cannot cover the scaled "
                                f"input_length {prompt_len}")
        tokens: list[int] = []
        for h in ids[:-(-prompt_len // block_tokens)]:
            if h not in blocks:
                blocks[h] = block_token_ids(seed, h, block_tokens, vocab_size)
            tokens.extend(blocks[h])
        if prompt_len + output_len > max_model_len:
            clipped += 1
            prompt_len = min(prompt_len, max_model_len - 1)
            output_len = max(1, min(output_len, max_model_len - prompt_len))
        requests.append(Request(id=f"hash-{lineno - 1}", prompt_token_ids=tuple(tokens[:prompt_len]),
                                max_tokens=output_len, arrival_time=arrival, ignore_eos=True, client_id=owners[i]))
    log.info("hash_ids trace %s: %d rows from row %d; %d tokens per trace block (lengths x%g, outputs x%g); "
             "%d requests clipped to max_model_len=%d; time compressed x%g", path.name, len(rows), cfg.start_row,
             cfg.block_tokens, scale, out_scale, clipped, max_model_len, cfg.time_scale)
    return requests


def _read_rows(path: Path, start: int, count: int | None) -> list[tuple[int, dict]]:
    rows: list[tuple[int, dict]] = []
    with path.open() as fh:
        for lineno, line in enumerate(fh, 1):
            if lineno <= start or not line.strip():
                continue
            if count is not None and len(rows) >= count:
                break
            try:
                rows.append((lineno, json.loads(line)))
            except json.JSONDecodeError as exc:
                raise WorkloadError(f"{path}:{lineno}: not valid JSON ({exc.msg})") from None
    return rows
