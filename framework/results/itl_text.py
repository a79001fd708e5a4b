"""The JSON text of one request's ``itl_ms`` list, fast: a simulated trace writes millions of
inter-token latencies, few of them distinct (the Azure trace: 4 million, 17 thousand distinct), and
``repr`` of each float was most of a request line's cost.

An ITL is a whole number of microseconds (:func:`~servelab.results.itl.itl_micros`), so each
distinct value's text is made once (``repr`` of the float, exactly what ``json.dumps`` writes) and
kept in an array indexed by its microseconds; a request's list is then one numpy gather and one
``join``. Values the table does not cover (negative, not finite, above :data:`TABLE_LIMIT`, a
``-0.0``) are written by ``repr`` one at a time: the text is always ``json.dumps`` of the list.
"""

from __future__ import annotations

import numpy as np

#: Microseconds the table covers (an ITL of 4.2 s; 32 MB of pointers at most, grown as needed).
TABLE_LIMIT = 1 << 22


class ItlText:
    """``text(micros)``: ``json.dumps((micros / 1000.0).tolist())`` for whole-microsecond ``micros``
    (:func:`~servelab.results.itl.itl_micros`), with each distinct value's text made once."""

    def __init__(self) -> None:
        self._texts = np.full(1 << 10, None, dtype=object)  # [us]: the text of us / 1000; None: not made yet

    def text(self, micros: np.ndarray) -> str:
        if not micros.size:
            return "[]"
        low = micros.min()
        # NaN fails the test; a zero may be -0.0, whose text differs
        if not low >= 0 or (low == 0 and np.signbit(micros).any()):
            return _plain(micros)
        keys = micros.astype(np.intp)
        try:
            parts = self._texts[keys].tolist()
            return "[" + ", ".join(parts) + "]"  # a TypeError where a text is not made yet (None)
        except IndexError:  # beyond the table
            if micros.max() >= TABLE_LIMIT:
                return _plain(micros)
            self._grow(int(micros.max()) + 1)
            parts = self._texts[keys].tolist()
        except TypeError:
            pass
        for us in {us for us, part in zip(keys.tolist(), parts) if part is None}:
            self._texts[us] = repr(us / 1000.0)  # the float itl_ms holds: the same division of the same whole number
        return "[" + ", ".join(self._texts[keys].tolist()) + "]"

    def _grow(self, size: int) -> None:
        texts = np.full(min(TABLE_LIMIT, max(size, 2 * self._texts.size)), None, dtype=object)
        texts[:self._texts.size] = self._texts
        self._texts = texts


def _plain(micros: np.ndarray) -> str:
    """The text by ``repr`` of each value (what the table would hold)."""
    return "[" + ", ".join(map(repr, (micros / 1000.0).tolist())) + "]"
