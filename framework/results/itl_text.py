"""The JSON text of one request's ``itl_ms`` list, fast: a simulated trace writes millions of
inter-token latencies, few of them distinct (the Azure trace: 4 million, 17 thousand distinct, all
within 15-110 ms), and ``repr`` of each float was most of a request line's cost.

An ITL is a whole number of microseconds (:func:`~servelab.results.itl.itl_micros`), so each value's
text is made once (``repr`` of the float, exactly what ``json.dumps`` writes) and kept in an array
indexed by its microseconds; a request's list is then one numpy gather and one ``join``. Texts are
made a block of :data:`BLOCK` microseconds at a time, the first time a value of the block is seen
(ITLs crowd together: the trace fills 95 blocks, where one value at a time would stop 7,600 of its
requests). Values the table does not cover (negative, not finite, :data:`TABLE_LIMIT` or more, a
``-0.0``) are written by ``repr`` one at a time: the text is always ``json.dumps`` of the list.
"""

from __future__ import annotations

import numpy as np

#: Microseconds the table covers (ITLs under 1.05 s): at most 8 MB of pointers and about 60 MB of
#: texts where a run's ITLs spread over all of it; a few MB where they crowd, as they do.
TABLE_LIMIT = 1 << 20
BLOCK_BITS = 10
BLOCK = 1 << BLOCK_BITS  # microseconds whose texts are made together
#: A float64's bits as an unsigned integer grow with its value from +0.0 up (NaN's above infinity's),
#: and the sign bit puts every negative value (-0.0 too) above them all: so one maximum of the bits
#: tells whether every value is a table index, from +0.0 to below TABLE_LIMIT.
_LIMIT_BITS = int(np.array(float(TABLE_LIMIT)).view(np.uint64))


class ItlText:
    """``text(micros)``: ``json.dumps((micros / 1000.0).tolist())`` for whole-microsecond ``micros``
    (:func:`~servelab.results.itl.itl_micros`), with each value's text made once."""

    def __init__(self) -> None:
        self._texts = np.full(0, None, dtype=object)  # [us]: the text of us / 1000; None: not made yet
        self._blocks: set[int] = set()  # the blocks (us >> BLOCK_BITS) whose texts are made

    def text(self, micros: np.ndarray) -> str:
        if not micros.size:
            return "[]"
        if micros.dtype != np.float64:
            return _plain(micros)
        bits = micros.view(np.uint64)
        if bits[bits.argmax()] >= _LIMIT_BITS:  # one pass: a negative, -0.0, NaN, inf, or past the table
            return _plain(micros)
        keys = micros.astype(np.intp)
        try:
            return f"[{', '.join(self._texts.take(keys).tolist())}]"
        except (IndexError, TypeError):  # a value past the table so far, or one whose text is not made (None)
            self._make(set((keys >> BLOCK_BITS).tolist()) - self._blocks)
            return f"[{', '.join(self._texts.take(keys).tolist())}]"

    def _make(self, blocks: set[int]) -> None:
        end = (max(blocks) + 1) << BLOCK_BITS
        if end > self._texts.size:
            texts = np.full(min(TABLE_LIMIT, max(end, 2 * self._texts.size)), None, dtype=object)
            texts[:self._texts.size] = self._texts
            self._texts = texts
        for block in blocks:
            start = block << BLOCK_BITS
            # the float itl_ms holds: the same division of the same whole number
            self._texts[start:start + BLOCK] = [repr(us / 1000.0) for us in range(start, start + BLOCK)]
        self._blocks |= blocks


def _plain(micros: np.ndarray) -> str:
    """The text by ``repr`` of each value (what the table would hold)."""
    return "[" + ", ".join(map(repr, (micros / 1000.0).tolist())) + "]"
