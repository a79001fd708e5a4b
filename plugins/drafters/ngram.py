"""Prompt-lookup drafting (``drafter=ngram``): the tokens that followed the latest earlier
occurrence of a sequence's last n tokens (n from ``max_n`` down to ``min_n``) in its own prompt
and output. No model, no probabilities: drafts are one-hot for rejection sampling.

Each live sequence owns a row of one int32 token table that grows by what is new each step, and
an :class:`~.ngram_index.NgramIndex` maps every n-gram of every row to where it last ended, so a
step's proposals cost O(sequences), not O(sequences x length).
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import repeat

import numpy as np

from servelab.plugin_api import ConfigError

from .common import BuiltinDrafter, DrafterConfig
from .ngram_index import NgramIndex


@dataclass
class NgramConfig(DrafterConfig):
    min_n: int = 2  # shortest suffix that may match
    max_n: int = 4  # longest suffix tried first


class NgramDrafter(BuiltinDrafter):
    """Prompt lookup (Saxena 2023; vLLM's ngram speculator)."""

    name = "ngram"
    Config = NgramConfig

    def __init__(self, config, context) -> None:
        super().__init__(config, context)
        if not 1 <= config.min_n <= config.max_n:
            raise ConfigError(f"drafter.min_n={config.min_n} and drafter.max_n={config.max_n} must satisfy "
                              "1 <= min_n <= max_n")
        # One row per live sequence, padded with -1; rows are reused after forget().
        self._table = np.full((8, 256), -1, dtype=np.int32)
        self._index = NgramIndex(config.min_n, config.max_n)
        self._rows: dict[str, int] = {}
        self._free_rows: list[int] = []
        self._lengths = np.zeros(8, dtype=np.int64)  # per row: tokens written

    def propose(self, seqs, k):
        if not seqs or self.disabled_for(len(seqs)):
            return [[] for _ in seqs]
        rows, lens = self._sync(seqs)
        self._index.extend(self._table, rows, lens - 1)
        return _drafts_after(self._table, rows, lens, self._index.lookup(self._table, rows, lens), k)

    def forget(self, seq) -> None:
        row = self._rows.pop(seq.id, None)
        if row is not None:
            self._table[row, :self._lengths[row]] = -1
            self._lengths[row] = 0
            self._index.reset_row(row)
            self._free_rows.append(row)

    def _sync(self, seqs) -> tuple[np.ndarray, np.ndarray]:
        """Each sequence's row and length, the row holding its tokens: only what is new since the
        last call is written, in one scatter for the usual one new token per sequence."""
        tokens = [s.token_ids for s in seqs]
        ids = [s.id for s in seqs]
        lens = np.fromiter(map(len, tokens), dtype=np.int64, count=len(seqs))
        rows = np.fromiter(map(self._rows.get, ids, repeat(-1)), dtype=np.int64, count=len(seqs))
        if (rows < 0).any() or int(lens.max()) > self._table.shape[1]:
            return self._sync_slowly(seqs, tokens, ids, lens, rows)
        have = self._lengths[rows]
        one_new = lens == have + 1
        if one_new.all():
            self._table[rows, have] = [t[-1] for t in tokens]
            self._lengths[rows] = lens
            return rows, lens
        return self._sync_slowly(seqs, tokens, ids, lens, rows)

    def _sync_slowly(self, seqs, tokens, ids, lens, rows) -> tuple[np.ndarray, np.ndarray]:
        for i, seq_id in enumerate(ids):
            if rows[i] < 0:
                rows[i] = self._rows[seq_id] = self._free_rows.pop() if self._free_rows else len(self._rows)
        num_rows, cols = self._table.shape
        if int(rows.max()) >= num_rows or int(lens.max()) > cols:
            shape = (max(num_rows, 2 * int(rows.max()) + 1), max(cols, 2 * int(lens.max())))
            self._table = _grown(self._table, shape)
            self._lengths = np.concatenate([self._lengths, np.zeros(shape[0] - num_rows, dtype=np.int64)])
        for row, n, toks in zip(rows.tolist(), lens.tolist(), tokens):
            have = int(self._lengths[row])
            if n > have:
                self._table[row, have:n] = toks[have:n]
                self._lengths[row] = n
        return rows, lens


def _grown(array: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
    grown = np.full(shape, -1, dtype=array.dtype)
    grown[:array.shape[0], :array.shape[1]] = array
    return grown


def _drafts_after(table: np.ndarray, rows: np.ndarray, lens: np.ndarray, ends: np.ndarray, k: int) -> list[list[int]]:
    """Per row: up to ``k`` tokens after position ``ends`` (none where ``ends`` is -1)."""
    counts = np.where(ends >= 0, np.minimum(k, lens - 1 - ends), 0)
    cols = np.minimum(ends[:, None] + 1 + np.arange(k), table.shape[1] - 1)
    drafts = table[rows[:, None], cols].tolist()
    return [d[:c] for d, c in zip(drafts, counts.tolist())]


def prompt_lookup(table: np.ndarray, lens: np.ndarray, min_n: int, max_n: int, k: int) -> list[list[int]]:
    """For each row of ``table`` (``lens[row]`` tokens, padded with -1): the up-to-``k`` tokens
    after the latest earlier occurrence of the longest matching suffix (``min_n``..``max_n`` tokens)."""
    rows = np.arange(len(lens))
    index = NgramIndex(min_n, max_n)
    index.extend(table, rows, lens - 1)
    return _drafts_after(table, rows, lens, index.lookup(table, rows, lens), k)
