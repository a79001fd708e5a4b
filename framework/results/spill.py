"""An append-only column of float64 that keeps at most ``memory_limit`` values in memory and the
rest in an anonymous temporary file: a run's per-token numbers (a million-request run has about
two hundred million token times) without gigabytes of memory. Reads give numpy arrays of a range."""

from __future__ import annotations

import tempfile
from array import array
from typing import IO, Iterable

import numpy as np

#: Values held in memory before they go to the file (32 MB of float64).
MEMORY_LIMIT = 1 << 22


class SpillingFloats:
    """``extend`` values, ``read(start, stop)`` any range of them back (in order), ``len``.

    The newest values, fewer than ``memory_limit`` (plus the last ``extend``), stay in memory;
    the older ones go to the file, a batch at a time. The file is deleted when the column is
    garbage-collected or the process ends."""

    def __init__(self, memory_limit: int | None = None) -> None:
        self.memory_limit = MEMORY_LIMIT if memory_limit is None else memory_limit
        self._tail = array("d")  # the values not in the file, after the ``_spilled`` that are
        self._spilled = 0
        self._file: IO[bytes] | None = None

    def __len__(self) -> int:
        return self._spilled + len(self._tail)

    def extend(self, values: Iterable[float]) -> None:
        if isinstance(values, np.ndarray):  # its bytes, not a Python float per value
            self._tail.frombytes(np.ascontiguousarray(values, dtype=np.float64).tobytes())
        else:
            self._tail.extend(values)
        if len(self._tail) >= self.memory_limit:
            self._spill()

    def _spill(self) -> None:
        if self._file is None:
            self._file = tempfile.TemporaryFile(prefix="servelab-tokens-")
        file = self._file
        file.seek(0, 2)
        self._tail.tofile(file)
        self._spilled += len(self._tail)
        self._tail = array("d")

    @property
    def spilled(self) -> bool:
        """Whether some values are in the file."""
        return self._spilled > 0

    def read(self, start: int = 0, stop: int | None = None) -> np.ndarray:
        """Values ``[start, stop)`` as a new float64 array (``stop`` None: to the end)."""
        stop = len(self) if stop is None else min(stop, len(self))
        if start >= stop:
            return np.zeros(0)
        parts = []
        if start < self._spilled:
            assert self._file is not None
            end = min(stop, self._spilled)
            self._file.seek(start * 8)
            parts.append(np.fromfile(self._file, dtype=np.float64, count=end - start))
        if stop > self._spilled:
            tail = np.frombuffer(self._tail, dtype=np.float64) if len(self._tail) else np.zeros(0)
            parts.append(tail[max(start - self._spilled, 0):stop - self._spilled].copy())
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        values = self.read()
        return values if dtype is None else values.astype(dtype)
