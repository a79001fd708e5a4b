"""Inter-token latencies (ITL), derived from token times when they are needed, never kept twice.

A request's ITLs are the gaps between its consecutive token times in milliseconds, rounded to the
microsecond (:func:`itl_ms`: what ``requests.jsonl``'s ``itl_ms`` holds). The summary's ``itl_ms``
figures are over every finished request's ITLs, in the order the requests ended; they are derived
here from the token times the fairness figures keep anyway (:class:`~servelab.results.fairness.ServiceLog`),
a batch of requests at a time.

:func:`itl_figures` gives exactly ``stats`` of the whole list (numpy's mean and linear percentiles,
bit for bit) in memory that does not grow with the run: a list longer than the spill column's
memory limit goes to a temporary file, its mean is numpy's own pairwise sum replayed over pieces
of the file (:func:`pairwise_sum`), and its percentiles are read off a histogram of its distinct
values ( an ITL is a whole number of microseconds: a coarse histogram as the values come, then exact
counts of the microseconds inside the few bins the percentiles fall in).
"""

from __future__ import annotations

import math
from array import array
from typing import Callable, Iterator

import numpy as np

from servelab.results.spill import SpillingFloats

PERCENTILES = (50, 90, 99)  # the summary's p50, p90, p99
LEAF = 1 << 18  # values read at once from a spilled list (2 MB; a few temporaries of this size)
#: The longest list given to numpy whole: ``np.percentile`` takes about five times the list's size
#: (a 4M-value list, 32 MB, took 165 MB more); a longer one goes the histogram way, the same figures.
NUMPY_LIMIT = 1 << 20


def itl_ms(token_times) -> np.ndarray:
    """One request's inter-token latencies (ms, to the microsecond) from its token times (s):
    ``np.round(np.diff(token_times) * 1e3, 3)``, bit for bit (:func:`itl_micros` / 1000)."""
    return itl_micros(token_times) / 1000.0


def itl_micros(token_times) -> np.ndarray:
    """One request's inter-token latencies as whole microseconds (float64; one fewer than its token
    times): :func:`itl_ms` is these divided by 1000, bit for bit, since ``np.round(x, 3)`` is
    ``rint(x * 1000) / 1000``. What ``requests.jsonl`` looks its ITL texts up by
    (:mod:`servelab.results.itl_text`). Done in place, without ``np.diff``'s and ``np.round``'s
    Python overhead: a simulated trace asks for it once per request."""
    if len(token_times) < 2:
        return np.zeros(0)
    times = (np.frombuffer(token_times, dtype=np.float64) if isinstance(token_times, array) and token_times.typecode == "d"
             else np.asarray(token_times, dtype=float))
    gaps = np.subtract(times[1:], times[:-1])
    gaps *= 1e3  # ms, as itl_ms always computed them; then np.round's own multiply by 10**3
    gaps *= 1000.0
    return np.rint(gaps, out=gaps)


def request_itl_stats(gaps: np.ndarray) -> dict[str, float] | None:
    """One request's ITLs ``gaps`` (:func:`itl_ms`) summarised: mean (exact: ``math.fsum``), p50, p90,
    p99 (numpy's linear percentiles) and max, each to the microsecond; None without any
    (``results.requests_format=stats``). In Python floats once numpy has sorted them: a few hundred
    values are indexed faster than numpy is called on them."""
    n = gaps.size
    if not n:
        return None
    ordered = np.sort(gaps)
    if math.isnan(ordered[-1]) or (ordered[0] == 0 and np.signbit(gaps).any()):
        values = sorted(gaps.tolist())  # where numpy's order may differ from sorted()'s (NaN; -0.0 with 0.0)
    else:
        values = ordered.tolist()
    p50, p90, p99 = (percentile_of_sorted(values, q) for q in PERCENTILES)
    return {"mean": round(math.fsum(values) / n, 3), "p50": round(p50, 3), "p90": round(p90, 3),
            "p99": round(p99, 3), "max": values[-1]}


def percentile_of_sorted(values: list[float], percentile: float) -> float:
    """``np.percentile(values, percentile)`` (method ``linear``), bit for bit, of ascending ``values``."""
    n = len(values)
    virtual = (n - 1) * (percentile / 100)
    if virtual >= n - 1:
        return values[-1]
    previous = math.floor(virtual)
    a, b, gamma = values[previous], values[previous + 1], virtual - previous
    diff = b - a
    return b - diff * (1 - gamma) if gamma >= 0.5 else a + diff * gamma


def derived_itls(times: SpillingFloats, ntok: np.ndarray, counted: np.ndarray,
                 batch_tokens: int) -> Iterator[np.ndarray]:
    """The ITLs of the requests with ``counted[k]``, request ``k`` owning the next ``ntok[k]`` token
    times of ``times``, in request order, about ``batch_tokens`` token times at a time."""
    ends = np.cumsum(ntok)
    starts = ends - ntok
    k, n = 0, len(ntok)
    while k < n:
        stop = max(k + 1, int(np.searchsorted(ends, starts[k] + batch_tokens, "right")))
        gaps = itl_ms(times.read(int(starts[k]), int(ends[stop - 1])))
        owner = np.repeat(np.arange(k, stop), ntok[k:stop])
        keep = (owner[:-1] == owner[1:]) & counted[owner[:-1]]
        yield gaps[keep]
        k = stop


def itl_figures(batches, memory_limit: int, stats: Callable[[np.ndarray], dict]) -> dict:
    """``stats`` of the concatenated ``batches`` (arrays of :func:`itl_ms` values), exactly, holding
    about ``memory_limit`` values at once beyond a histogram of their microseconds."""
    column = SpillingFloats(memory_limit)
    coarse = _Counts()
    for batch in batches:
        column.extend(batch)
        coarse.add(_microseconds(batch) >> _FINE_BITS)
    if not column.spilled:  # all in memory: numpy's own figures
        return stats(column.read())
    n = len(column)
    ranks = _order_statistics(n, PERCENTILES)
    wanted = coarse.locate(ranks)
    fine = {int(b): _Counts() for b in wanted[0]}

    def read(start: int, stop: int) -> np.ndarray:  # a piece of the pairwise sum; its microseconds too
        values = column.read(start, stop)
        keys = _microseconds(values)
        for b, counts in fine.items():
            counts.add(keys[(keys >> _FINE_BITS) == b] & _FINE_MASK)
        return values

    mean = pairwise_sum(read, 0, n, min(memory_limit, LEAF)) / n
    at = np.array([(b << _FINE_BITS) + fine[int(b)].locate(np.array([r]))[0][0]
                   for b, r in zip(*wanted)], dtype=np.float64) / 1e3
    p50, p90, p99 = _interpolate(n, PERCENTILES, at)
    return {"mean": float(mean), "p50": float(p50), "p90": float(p90), "p99": float(p99)}


_FINE_BITS = 12  # the coarse histogram's bins are 4,096 us wide; the fine one counts each microsecond of a bin
_FINE_MASK = (1 << _FINE_BITS) - 1


def _microseconds(values: np.ndarray) -> np.ndarray:
    """Each :func:`itl_ms` value as its whole number of microseconds (``/ 1e3`` gives it back exactly)."""
    keys = np.rint(values * 1e3).astype(np.int64)
    if keys.size and keys.min() < 0:
        raise ValueError("an inter-token latency is negative: token times went backwards")
    return keys


class _Counts:
    """How often each non-negative integer occurred."""

    def __init__(self) -> None:
        self.counts = np.zeros(0, dtype=np.int64)

    def add(self, keys: np.ndarray) -> None:
        if not keys.size:
            return
        c = np.bincount(keys)
        if c.size > self.counts.size:
            self.counts = np.concatenate([self.counts, np.zeros(c.size - self.counts.size, dtype=np.int64)])
        self.counts[:c.size] += c

    def locate(self, ranks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(key, rank among that key's occurrences)`` of the ``ranks``-th smallest (0-based)."""
        cumulative = np.cumsum(self.counts)
        key = np.searchsorted(cumulative, ranks, "right")
        return key, ranks - (cumulative[key] - self.counts[key])


def _order_statistics(n: int, percentiles) -> np.ndarray:
    """The 0-based ranks numpy's linear percentiles of ``n`` values interpolate between: for each
    percentile, the one below and the one above."""
    previous, following, _ = _indexes(n, percentiles)
    return np.concatenate([previous, following]).astype(np.int64)


def _indexes(n: int, percentiles):
    virtual = (n - 1) * np.true_divide(np.asarray(percentiles, dtype=float), 100)
    previous = np.floor(virtual)
    following = previous + 1
    top = virtual >= n - 1  # numpy takes index -1, the largest, for both
    previous[top] = following[top] = n - 1
    return previous, following, virtual - previous  # where top, both ends are equal: gamma does not matter


def _interpolate(n: int, percentiles, at: np.ndarray) -> np.ndarray:
    """numpy's linear interpolation (``_lerp``) between the order statistics ``at`` (previous ones, then following)."""
    _, _, gamma = _indexes(n, percentiles)
    a, b = at[:len(gamma)], at[len(gamma):]
    diff = b - a
    out = a + diff * gamma
    upper = gamma >= 0.5
    out[upper] = (b - diff * (1 - gamma))[upper]
    return out


def pairwise_sum(read: Callable[[int, int], np.ndarray], start: int, count: int, leaf: int) -> float:
    """``np.add.reduce`` of the ``count`` values from ``start`` (``read(a, b)`` gives values ``[a, b)``),
    bit for bit, reading at most ``max(leaf, 128)`` at a time: numpy sums a contiguous float64 array
    pairwise, halving it (the first half a multiple of 8) until a piece has at most 128 values, so
    the sum of a long array is the sum of its two halves' sums, each numpy's sum of that half."""
    if count <= max(leaf, 128):
        return float(np.add.reduce(read(start, start + count)))
    half = count // 2
    half -= half % 8
    return pairwise_sum(read, start, half, leaf) + pairwise_sum(read, start + half, count - half, leaf)
