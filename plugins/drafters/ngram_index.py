"""The lookup behind ``drafter=ngram``: for every n-gram (``min_n <= n <= max_n``) of every row of a
token table, the position where its latest occurrence ends, kept in one open-addressing hash
table in numpy arrays.

Why an index and not a search: a decode step adds one token per sequence, so keeping the index
current costs O(batch) per step, and a lookup is O(batch) too, whatever the sequences' lengths.
Scanning every row for the suffix costs O(batch x length) and could not serve 256 sequences of
2k tokens in well under a millisecond.

Keys are 40-bit hashes of the row's salt and the n-gram's tokens (n is the chain's length), packed over the 24-bit end position (sequences
up to 16M tokens) in one uint64 slot; a hit is checked against the tokens before it is
used, so a collision can at worst hide an occurrence, never invent one. A row's salt changes when
the row is reset, which turns its old entries into garbage that the next rebuild drops.
"""

from __future__ import annotations

import numpy as np

_MIN_CAPACITY = 1 << 12
# A slot packs a key's top 40 bits over the n-gram's end position (below 2**24).
_END_BITS = 24
_END_LIMIT = np.uint64(1 << _END_BITS)
_END_MASK = np.uint64((1 << _END_BITS) - 1)
_KEY_MASK = ~_END_MASK


def _mix(h: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser: every input bit reaches every output bit."""
    h = (h ^ (h >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    h = (h ^ (h >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return h ^ (h >> np.uint64(31))


class NgramIndex:
    """Latest end position of each n-gram of the rows of a caller-owned token table.

    Contract: the caller appends tokens to a row and calls :meth:`extend` with the row's new
    length minus one, so positions ``< indexed(row)`` are indexed and the last token (the query
    suffix's end) is not; rows only grow until :meth:`reset_row`.
    """

    def __init__(self, min_n: int, max_n: int) -> None:
        self.min_n, self.max_n = min_n, max_n
        self._salt = np.zeros(0, dtype=np.uint64)  # per row; changes on reset
        self._salts_issued = 0
        self._indexed = np.zeros(0, dtype=np.int64)  # per row: positions below this are indexed
        self._slots = np.zeros(_MIN_CAPACITY, dtype=np.uint64)  # key bits | end; 0 = empty (key bits never are)
        self._filled = 0  # slots holding a key, garbage included

    def reset_row(self, row: int) -> None:
        """Forget ``row``'s entries (its next tokens start a new sequence)."""
        self._grow_rows(row + 1)
        self._salt[row] = self._fresh_salts(1)[0]
        self._indexed[row] = 0

    def extend(self, table: np.ndarray, rows: np.ndarray, stops: np.ndarray) -> None:
        """Index every n-gram of ``rows`` ending at a position below ``stops`` not indexed yet."""
        if not len(rows):
            return
        if int(stops.max()) >= 1 << _END_BITS:
            raise ValueError(f"drafter=ngram indexes sequences of up to {1 << _END_BITS} tokens")
        self._grow_rows(int(rows.max()) + 1)
        starts = self._indexed[rows]
        counts = np.maximum(stops - starts, 0)
        if not counts.any():
            return
        self._indexed[rows] = np.maximum(stops, starts)
        if (counts == 1).all():
            at_rows, ends = rows, starts
        else:
            at_rows = np.repeat(rows, counts)
            ends = np.arange(int(counts.sum())) - np.repeat(np.cumsum(counts) - counts - starts, counts)
        if self._filled + len(ends) * (self.max_n - self.min_n + 1) > len(self._slots) // 2:
            self._rebuild(table)
            return
        ngrams, exists = self._ngrams(table, at_rows, ends)
        valid = exists[:, self.min_n - 1:].T.ravel()
        keys = self._hashes(at_rows, ngrams).ravel()[valid]
        ends = np.tile(ends, self.max_n - self.min_n + 1)[valid]
        if not (counts <= 1).all():  # one n-gram twice in a row's new positions: the latest end wins
            _, last = np.unique(keys[::-1], return_index=True)
            keep = len(keys) - 1 - last
            keys, ends = keys[keep], ends[keep]
        self._put(keys, ends)

    def lookup(self, table: np.ndarray, rows: np.ndarray, lens: np.ndarray) -> np.ndarray:
        """Per row: the end of the latest earlier occurrence of its longest matching suffix (the
        suffix ends at ``lens - 1``), or -1."""
        ends = lens - 1
        suffix, exists = self._ngrams(table, rows, ends)
        keys = self._hashes(rows, suffix)
        exists = exists[:, self.min_n - 1:].T
        hits = self._get(np.where(exists, keys, _END_LIMIT).ravel()).reshape(len(keys), -1)
        hits[~exists] = -1
        found = np.full(len(rows), -1, dtype=np.int64)
        length = np.zeros(len(rows), dtype=np.int64)
        for n, hit in zip(range(self.min_n, self.max_n + 1), hits):  # longer n overrides
            found, length = np.where(hit >= 0, hit, found), np.where(hit >= 0, n, length)
        # A hash hit must be the same tokens (a collision then hides the occurrence).
        there, _ = self._ngrams(table, rows, found)
        same = (there == suffix) | (np.arange(self.max_n) >= length[:, None])
        return np.where(same.all(1), found, -1)

    # ---- hashing ----

    def _ngrams(self, table, rows, ends) -> tuple[np.ndarray, np.ndarray]:
        """``[i, j]``: the token ``j`` places before ``ends[i]`` in row ``rows[i]``, and whether
        that position exists."""
        at = ends[:, None] - np.arange(self.max_n)
        return table[rows[:, None], np.maximum(at, 0)], at >= 0

    def _hashes(self, rows, ngrams) -> np.ndarray:
        """``[n - min_n, i]``: the key of the n-gram ending with ``ngrams[i, 0]`` (its tokens
        ``ngrams[i, :n]`` backwards) in row ``rows[i]``."""
        h = self._salt[rows]
        tokens = ngrams.astype(np.uint64)
        keys = np.empty((self.max_n - self.min_n + 1, len(rows)), dtype=np.uint64)
        for j in range(self.max_n):
            h = _mix(h ^ tokens[:, j])
            if j + 1 >= self.min_n:
                keys[j + 1 - self.min_n] = h | _END_LIMIT  # never 0 in the key bits
        return keys

    # ---- the open-addressing table ----

    def _put(self, keys: np.ndarray, ends: np.ndarray) -> None:
        """Store ``ends`` under ``keys`` (distinct), linear probing from each key's home slot."""
        mask = len(self._slots) - 1
        entries = keys & _KEY_MASK | ends.astype(np.uint64)
        slots = (keys >> _END_BITS).astype(np.int64) & mask
        todo = np.arange(len(keys))
        while len(todo):
            at = slots[todo]
            current = self._slots[at]
            empty = current == 0
            usable = empty | ((current ^ entries[todo]) < _END_LIMIT)
            claim = todo[usable]
            self._slots[slots[claim]] = entries[claim]  # two keys may race for one empty slot
            won = (self._slots[slots[claim]] ^ entries[claim]) < _END_LIMIT
            self._filled += int((empty[usable] & won).sum())
            todo = np.concatenate([todo[~usable], claim[~won]])
            slots[todo] = (slots[todo] + 1) & mask

    def _get(self, keys: np.ndarray) -> np.ndarray:
        """The ends stored under ``keys``, -1 where absent. Without deletions a key sits before the
        first empty slot of its probe sequence, so an empty slot ends the search."""
        mask = len(self._slots) - 1
        wanted = keys & _KEY_MASK
        slots = (keys >> _END_BITS).astype(np.int64) & mask
        out = np.full(len(keys), -1, dtype=np.int64)
        todo = np.arange(len(keys))
        while len(todo):
            current = self._slots[slots[todo]]
            hit = (current & _KEY_MASK) == wanted[todo]
            out[todo[hit]] = (current[hit] & _END_MASK).astype(np.int64)
            todo = todo[~hit & (current != 0)]
            slots[todo] = (slots[todo] + 1) & mask
        return out

    def _rebuild(self, table: np.ndarray) -> None:
        """Re-index every row's indexed positions (new ones included) into a table sized for
        them, dropping garbage."""
        live = int(self._indexed.sum())
        capacity = max(_MIN_CAPACITY, 1 << int(np.ceil(np.log2(4 * live * (self.max_n - self.min_n + 1) + 1))))
        self._slots = np.zeros(capacity, dtype=np.uint64)
        self._filled = 0
        indexed, self._indexed = self._indexed, np.zeros_like(self._indexed)
        rows = np.flatnonzero(indexed)
        if len(rows):
            self.extend(table, rows, indexed[rows])

    def _fresh_salts(self, count: int) -> np.ndarray:
        """Salts never handed out before, from a counter: deriving a row's new salt from its old
        one the way a chain step does (``mix(old ^ token)``) would make the new occupant's n-grams
        collide with its predecessor's one token longer."""
        self._salts_issued += count
        return _mix(np.arange(self._salts_issued - count, self._salts_issued, dtype=np.uint64)
                    + np.uint64(0x632BE59BD9B4E019))

    def _grow_rows(self, num_rows: int) -> None:
        if num_rows > len(self._salt):
            grown = max(num_rows, 2 * len(self._salt))
            self._salt = np.concatenate([self._salt, self._fresh_salts(grown - len(self._salt))])
            self._indexed = np.concatenate([self._indexed, np.zeros(grown - len(self._indexed), dtype=np.int64)])
