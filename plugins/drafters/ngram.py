"""Prompt-lookup drafting (``drafter=ngram``): the tokens that followed the latest earlier
occurrence of a sequence's last n tokens (n from ``max_n`` down to ``min_n``) in its own prompt
and output. No model, no probabilities: drafts are one-hot for rejection sampling.

Each sequence's tokens are kept as a numpy buffer that grows by what is new each step; one
batched search serves every sequence: candidates are the positions holding the last token,
and each longer match is checked by gathering one earlier column.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from servelab.errors import ConfigError

from .common import BuiltinDrafter, DrafterConfig


@dataclass
class NgramConfig(DrafterConfig):
    min_n: int = 2  # shortest suffix that may match
    max_n: int = 4  # longest suffix tried first


class NgramDrafter(BuiltinDrafter):
    """Prompt lookup (Saxena 2023; vLLM's ngram speculator)."""

    name = "ngram"
    Config = NgramConfig

    def __init__(self, config, limits) -> None:
        super().__init__(config, limits)
        if not 1 <= config.min_n <= config.max_n:
            raise ConfigError(f"drafter.min_n={config.min_n} and drafter.max_n={config.max_n} must satisfy "
                              "1 <= min_n <= max_n")
        self._buffers: dict[str, np.ndarray] = {}
        self._lengths: dict[str, int] = {}

    def propose(self, seqs, k):
        if not seqs or self.disabled_for(len(seqs)):
            return [[] for _ in seqs]
        lens = np.fromiter((s.num_tokens for s in seqs), dtype=np.int64, count=len(seqs))
        table = np.full((len(seqs), int(lens.max())), -1, dtype=np.int64)
        for row, seq in enumerate(seqs):
            table[row, :lens[row]] = self._tokens(seq)
        return prompt_lookup(table, lens, self.config.min_n, self.config.max_n, k)

    def forget(self, seq) -> None:
        self._buffers.pop(seq.id, None)
        self._lengths.pop(seq.id, None)

    def _tokens(self, seq) -> np.ndarray:
        """``seq.token_ids`` as numpy, converting only what is new since the last call."""
        buf, have = self._buffers.get(seq.id), self._lengths.get(seq.id, 0)
        n = seq.num_tokens
        if buf is None or n > len(buf):
            grown = np.empty(max(2 * n, 64), dtype=np.int64)
            if buf is not None:
                grown[:have] = buf[:have]
            buf = self._buffers[seq.id] = grown
        if n > have:
            buf[have:n] = seq.token_ids[have:n]
            self._lengths[seq.id] = n
        return buf[:n]


def prompt_lookup(table: np.ndarray, lens: np.ndarray, min_n: int, max_n: int, k: int) -> list[list[int]]:
    """For each row of ``table`` (``lens[row]`` tokens, padded with -1): the up-to-``k`` tokens
    after the latest earlier occurrence of the longest matching suffix (``min_n``..``max_n`` tokens)."""
    rows_n = len(lens)
    row_ids = np.arange(rows_n)
    last = table[row_ids, lens - 1]
    # Candidate ends p of an earlier occurrence: table[p] == last token, p < len - 1 (something follows).
    rows, ends = np.nonzero(table[:, :-1] == last[:, None]) if table.shape[1] > 1 else (np.empty(0, int),) * 2
    keep = ends < lens[rows] - 1
    rows, ends = rows[keep], ends[keep]
    matched = np.ones(len(rows), dtype=np.int64)  # suffix length matched so far
    alive = np.ones(len(rows), dtype=bool)
    for j in range(1, max_n):
        ok = alive & (ends - j >= 0) & (lens[rows] - 1 - j >= 0)
        ok[ok] = table[rows[ok], ends[ok] - j] == table[rows[ok], lens[rows[ok]] - 1 - j]
        matched += ok
        alive = ok
    good = matched >= min_n
    rows, ends, matched = rows[good], ends[good], matched[good]
    out: list[list[int]] = [[] for _ in range(rows_n)]
    if len(rows) == 0:
        return out
    # Best per row: the longest match, then the latest. Sort by (row, matched, end); take each row's last.
    order = np.lexsort((ends, matched, rows))
    rows, ends = rows[order], ends[order]
    last_of_row = np.flatnonzero(np.r_[rows[1:] != rows[:-1], True])
    for row, end in zip(rows[last_of_row].tolist(), ends[last_of_row].tolist()):
        stop = min(end + 1 + k, int(lens[row]))
        out[row] = table[row, end + 1:stop].tolist()
    return out
