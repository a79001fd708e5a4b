"""Prompt-lookup drafting (``drafter=ngram``): the tokens that followed the latest earlier
occurrence of a sequence's last n tokens (n from ``max_n`` down to ``min_n``) in its own prompt
and output. No model, no probabilities: drafts are one-hot for rejection sampling.

Each live sequence owns a row of one int32 table that grows by what is new each step; one
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
        # One row per live sequence, padded with -1; rows are reused after forget().
        self._table = np.full((8, 256), -1, dtype=np.int32)
        self._keys = np.full((8, 256), -1, dtype=np.int64)  # ngram_keys of the table, kept in step
        self._key_len = key_length(config.min_n)
        self._rows: dict[str, int] = {}
        self._free_rows: list[int] = []
        self._lengths: dict[str, int] = {}

    def propose(self, seqs, k):
        if not seqs or self.disabled_for(len(seqs)):
            return [[] for _ in seqs]
        rows = np.fromiter((self._sync(s) for s in seqs), dtype=np.int64, count=len(seqs))
        lens = np.fromiter((s.num_tokens for s in seqs), dtype=np.int64, count=len(seqs))
        return _lookup(self._table, self._keys, rows, lens, self.config.min_n, self.config.max_n, k)

    def forget(self, seq) -> None:
        row = self._rows.pop(seq.id, None)
        if row is not None:
            n = self._lengths.pop(seq.id)
            self._table[row, :n] = -1
            self._keys[row, :n] = -1
            self._free_rows.append(row)

    def _sync(self, seq) -> int:
        """``seq``'s row, holding its tokens: only what is new since the last call is written."""
        row = self._rows.get(seq.id)
        if row is None:
            row = self._rows[seq.id] = self._free_rows.pop() if self._free_rows else len(self._rows)
            self._lengths[seq.id] = 0
        tokens = seq.token_ids
        have, n = self._lengths[seq.id], len(tokens)
        rows, cols = self._table.shape
        if row >= rows or n > cols:
            shape = (max(rows, 2 * row + 1), max(cols, 2 * n))
            self._table, self._keys = (_grown(t, shape) for t in (self._table, self._keys))
        table, keys, key_len = self._table, self._keys, self._key_len
        if n - have == 1:  # the common case: one new token, one new key
            table[row, have] = tokens[have]
            if have >= key_len - 1:
                key = 0
                for j in range(key_len):
                    key |= int(table[row, have - j]) << (KEY_BITS * j)
                keys[row, have] = key
        elif n > have:
            table[row, have:n] = tokens[have:n]
            lo = max(0, have - key_len + 1)
            keys[row, have:n] = ngram_keys(table[row:row + 1, lo:n], key_len)[0, have - lo:]
        self._lengths[seq.id] = n
        return row


def _grown(array: np.ndarray, shape: tuple[int, int]) -> np.ndarray:
    grown = np.full(shape, -1, dtype=array.dtype)
    grown[:array.shape[0], :array.shape[1]] = array
    return grown


KEY_BITS = 21  # token ids below 2**21 (every vocabulary we know): three of them pack into one int64


def key_length(min_n: int) -> int:
    """How many trailing tokens a position's key packs: the shortest allowed match, at most 3."""
    return min(min_n, 3)


def ngram_keys(table: np.ndarray, key_len: int) -> np.ndarray:
    """``keys[r, p]``: tokens ``p - key_len + 1 .. p`` of row ``r`` packed into one int64 (-1 where
    the row has fewer tokens or a pad is involved)."""
    keys = table.astype(np.int64)
    for j in range(1, key_len):
        shifted = np.full_like(keys, -1)
        shifted[:, j:] = table[:, :-j]
        keys = np.where((keys >= 0) & (shifted >= 0), keys | (shifted << (KEY_BITS * j)), -1)
    return keys


def prompt_lookup(table: np.ndarray, lens: np.ndarray, min_n: int, max_n: int, k: int) -> list[list[int]]:
    """For each row of ``table`` (``lens[row]`` tokens, padded with -1): the up-to-``k`` tokens
    after the latest earlier occurrence of the longest matching suffix (``min_n``..``max_n`` tokens)."""
    keys = ngram_keys(table, key_length(min_n))
    return _lookup(table, keys, np.arange(len(lens)), lens, min_n, max_n, k)


def _lookup(table: np.ndarray, keys: np.ndarray, rows: np.ndarray, lens: np.ndarray, min_n: int, max_n: int,
            k: int) -> list[list[int]]:
    """:func:`prompt_lookup` for the sequences in ``rows`` of a larger ``table`` (``keys`` from
    :func:`ngram_keys`), searched in place: the first pass compares whole short n-grams of every
    row at once, so few candidates survive to be extended one earlier column at a time."""
    key_len = key_length(min_n)
    out: list[list[int]] = [[] for _ in range(len(rows))]
    span = int(rows.max()) + 1
    width = int(lens.max()) - 1  # an occurrence must end before the suffix's last token
    if width < 1:
        return out
    target = np.full(span, -2, dtype=np.int64)  # rows outside the batch (and pads) match nothing
    last = keys[rows, lens - 1]
    target[rows] = np.where(last >= 0, last, -2)
    row_len = np.zeros(span, dtype=np.int64)
    row_len[rows] = lens
    batch_of = np.zeros(span, dtype=np.int64)
    batch_of[rows] = np.arange(len(rows))
    r, ends = np.divmod(np.flatnonzero(keys[:span, :width] == target[:, None]), width)
    keep = ends < row_len[r] - 1
    r, ends = r[keep], ends[keep]
    matched = np.full(len(r), key_len, dtype=np.int64)  # suffix length matched so far
    alive, alive_r, alive_e = np.arange(len(r)), r, ends  # candidates still matching, shrinking
    suffix = np.full(span, -2, dtype=np.int64)  # per row: the suffix token j places before the last
    for j in range(key_len, max_n):
        suffix[rows] = np.where(lens - 1 - j >= 0, table[rows, np.maximum(lens - 1 - j, 0)], -2)
        fits = alive_e - j >= 0
        alive, alive_r, alive_e = alive[fits], alive_r[fits], alive_e[fits]
        ok = table[alive_r, alive_e - j] == suffix[alive_r]
        alive, alive_r, alive_e = alive[ok], alive_r[ok], alive_e[ok]
        if not len(alive):
            break
        matched[alive] += 1
    good = matched >= min_n
    r, ends, matched = r[good], ends[good], matched[good]
    if len(r) == 0:
        return out
    # Best per row: the longest match, then the latest. Candidates come sorted by (row, end), so
    # each row's are contiguous: one reduceat of a score ordered like (matched, end).
    starts = np.flatnonzero(np.r_[True, r[1:] != r[:-1]])
    best = np.maximum.reduceat(matched * (width + 1) + ends, starts)
    for row, end in zip(r[starts].tolist(), (best % (width + 1)).tolist()):
        stop = min(end + 1 + k, int(row_len[row]))
        out[int(batch_of[row])] = table[row, end + 1:stop].tolist()
    return out
