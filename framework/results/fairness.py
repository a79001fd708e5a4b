"""Fairness between clients (``Request.client_id``): the service each got, the largest service gap
between two clients while both were backlogged, and Jain's index (Sheng et al., "Fairness in
Serving Large Language Models", OSDI'24). Definitions: docs/metrics.md.

- Service: ``input_weight`` x a request's prompt tokens, counted when its first token is
  emitted, plus ``output_weight`` per output token, counted when it is emitted (``fairness.*``;
  VTC's w_p = 1, w_q = 2).
- A request is *queued* over ``(arrival, admitted]`` (admitted: the step it was first scheduled
  in starts; one that never was is queued until it ends, or to the end of the run); a client is
  *backlogged* while one of its requests is queued: VTC's definition (a client with requests in
  the waiting queue), under which a client whose every request is admitted at once asks for no
  more than it gets and is not compared. A point t is in an interval ``(a, b]`` when
  a < t <= b: the tokens of a step that ends as a request arrives were computed before it was there.
- Requests without a client count as the anonymous client ``""`` (as ``scheduler=vtc`` does); a
  run with fewer than two distinct clients has no fairness figures (``None``).

All pairs of clients at once, in numpy: the work is O(J log E) for E service events and J the
events inside the periods two clients were backlogged together (E x the typical number of clients
backlogged at once), so a server with thousands of users costs no more than its overlaps.
"""

from __future__ import annotations

import math
from array import array
from typing import Iterable, NamedTuple

import numpy as np

from servelab.core.errors import ConfigError
from servelab.results.spill import SpillingFloats

ANONYMOUS = ""  # the client of requests without a client_id
DEFAULT_WEIGHTS = (1.0, 2.0)  # (input_weight, output_weight): fairness.* defaults, VTC's w_p and w_q
FIGURES = ("service_by_client", "max_service_gap_tokens", "jain_fairness_index")


def config_weights(cfg) -> tuple[float, float]:
    """``(fairness.input_weight, fairness.output_weight)`` of a run config (the defaults when it has
    none); a :class:`ConfigError` naming the key unless both are finite and > 0."""
    section = cfg.get("fairness") if cfg is not None else None
    weights = []
    for key, default in zip(("input_weight", "output_weight"), DEFAULT_WEIGHTS):
        value = default if section is None or section.get(key) is None else float(section.get(key))
        if not (math.isfinite(value) and value > 0):
            raise ConfigError(f"fairness.{key}={value:g} must be > 0")
        weights.append(value)
    return weights[0], weights[1]


class ServiceLog:
    """What the fairness figures need of each admitted request, kept as numbers as requests end:
    its client, when it was pending, its prompt length and its tokens' times (8 bytes a token, in a
    :class:`~servelab.results.spill.SpillingFloats`: a long run keeps most of them in a temporary
    file; the summary's inter-token latencies are derived from them too, :mod:`servelab.results.itl`)."""

    def __init__(self) -> None:
        self.names: list[str] = []  # client index -> client id
        self._index: dict[str, int] = {}
        self.client, self.ntok = array("i"), array("q")
        self.start, self.end, self.prompt = array("d"), array("d"), array("d")
        self.times = SpillingFloats()  # every request's token times, back to back

    def add(self, client_id: str | None, arrival_s: float, end_s: float | None, prompt_len: int,
            token_times) -> None:
        """One request that was not rejected; ``end_s``: when it stopped being queued (admitted,
        or ended while waiting); None = still queued when the run ended."""
        name = ANONYMOUS if client_id is None else client_id
        if name not in self._index:
            self._index[name] = len(self.names)
            self.names.append(name)
        self.client.append(self._index[name])
        self.start.append(arrival_s)
        self.end.append(math.inf if end_s is None else max(end_s, arrival_s))
        self.prompt.append(prompt_len)
        self.ntok.append(len(token_times))
        self.times.extend(token_times)

    def add_record(self, rec: dict, seq=None) -> None:
        """A ``requests.jsonl`` record (rejected ones are skipped). With its ``seq`` the exact token
        times and the time it was admitted (or ended while waiting); from the record alone, token
        times are rebuilt from ``ttft_ms`` and ``itl_ms`` (to about a microsecond), admission from
        ``queue_ms``, and a request that ended while waiting is taken as never queued (the record
        does not say when it ended)."""
        if rec.get("rejected_reason") is not None:
            return
        arrival = rec.get("arrival_s", 0.0)
        if seq is not None:
            times = seq.token_times
            end = seq.first_scheduled_time if seq.first_scheduled_time is not None else seq.finish_time
        else:
            times = record_token_times(rec)
            if rec.get("queue_ms") is not None:
                end = arrival + rec["queue_ms"] / 1e3
            else:
                end = None if rec.get("finish_reason") is None else arrival
        self.add(rec.get("client_id"), arrival, end, rec.get("prompt_len", 0), times)

    @classmethod
    def of(cls, records: Iterable[dict]) -> "ServiceLog":
        log = cls()
        for rec in records:
            log.add_record(rec)
        return log

    def events(self, input_weight: float, output_weight: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(time, client, weight)`` of every service event, sorted by client, then time."""
        ntok = np.frombuffer(self.ntok, dtype=np.int64) if len(self.ntok) else np.zeros(0, np.int64)
        times = self.times.read()
        client = np.repeat(np.asarray(self.client, dtype=np.int64), ntok)
        weight = np.full(times.size, float(output_weight))
        served = ntok > 0
        firsts = (np.cumsum(ntok) - ntok)[served]
        weight[firsts] += input_weight * np.asarray(self.prompt)[served]
        order = np.lexsort((times, client))
        return times[order], client[order], weight[order]

    def periods(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Every client's backlogged periods ``(start, end]`` (the union of its requests' queued
        intervals) as ``(client, start, end)``, sorted by client, then start."""
        client = np.asarray(self.client, dtype=np.int64)
        start, end = np.asarray(self.start), np.asarray(self.end)
        keep = end > start  # a request admitted as it arrived was never queued
        client, start, end = client[keep], start[keep], end[keep]
        order = np.lexsort((start, client))
        client, start, end = client[order], start[order], end[order]
        if not client.size:
            return client, start, end
        # merge within each client: ranks in one grid, offset per client, so one running max serves all
        grid = np.unique(np.concatenate((start, end)))
        span = grid.size + 1
        lo = client * span + np.searchsorted(grid, start)
        hi = client * span + np.searchsorted(grid, end)
        reach = np.maximum.accumulate(hi)
        new = np.concatenate(([True], lo[1:] > reach[:-1]))
        first = np.flatnonzero(new)
        last = np.concatenate((first[1:], [client.size])) - 1
        return client[first], start[first], grid[reach[last] - client[first] * span]


def record_token_times(rec: dict) -> np.ndarray:
    """A record's token times (engine seconds) from its ``arrival_s``, ``ttft_ms`` and ``itl_ms``;
    a record without ``itl_ms`` (``results.requests_format=stats``) has its ``output_len`` tokens
    spread evenly from the first (``ttft_ms``) to the last (``e2e_ms``)."""
    if rec.get("ttft_ms") is None:
        return np.zeros(0)
    first = rec.get("arrival_s", 0.0) + rec["ttft_ms"] / 1e3
    if "itl_ms" not in rec and rec.get("e2e_ms") is not None:
        last = rec.get("arrival_s", 0.0) + rec["e2e_ms"] / 1e3
        return np.linspace(first, last, max(1, int(rec.get("output_len") or 1)))
    return first + np.concatenate(([0.0], np.cumsum(rec.get("itl_ms") or [], dtype=float))) / 1e3


def _ranges(lo: np.ndarray, hi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``concatenate([arange(lo[k], hi[k]) for k])`` and each element's k, without a Python loop."""
    n = np.maximum(hi - lo, 0)
    k = np.repeat(np.arange(lo.size), n)
    return np.arange(int(n.sum())) - np.repeat(np.cumsum(n) - n, n) + lo[k], k


def joint_periods(periods) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Every period ``(a, b]`` two clients i != j were both backlogged, as ``(i, j, a, b)``: each
    overlap of two clients' periods once."""
    client, start, end = periods
    order = np.argsort(start, kind="stable")
    client, start, end = client[order], start[order], end[order]
    # the periods starting inside period q (after it in start order): one client's never overlap
    other, q = _ranges(np.arange(start.size) + 1, np.searchsorted(start, end, "left"))
    return client[q], client[other], start[other], np.minimum(end[q], end[other])


class _Served:
    """Every client's cumulative service W_c(t) (its events at times <= t), for many (c, t) at once."""

    def __init__(self, log: ServiceLog, input_weight: float, output_weight: float) -> None:
        times, client, weight = log.events(input_weight, output_weight)
        self.times, self.client, self.weight = times, client, weight  # sorted by client, then time
        self.grid = np.unique(times)
        self.span = self.grid.size + 1
        self.keys = client * self.span + np.searchsorted(self.grid, times)  # ascending
        self.prefix = np.concatenate(([0.0], np.cumsum(weight)))
        self.first = np.searchsorted(client, np.arange(len(log.names) + 1))  # each client's first event

    def at(self, c: np.ndarray, t: np.ndarray) -> np.ndarray:
        """W_c(t) for each pair ``(c[k], t[k])``."""
        return self.prefix[self.position(c, t)] - self.prefix[self.first[c]]

    def position(self, c: np.ndarray, t: np.ndarray) -> np.ndarray:
        """Just past client c's events at times <= t."""
        return np.searchsorted(self.keys, c * self.span + np.searchsorted(self.grid, t, "right"), "left")


#: Joint-period events evaluated per batch (bounds memory when many clients overlap for long).
BATCH_EVENTS = 4_000_000


def max_service_gap(served: _Served, joint) -> float:
    """The largest max D - min D over the joint periods (a, b] of clients (i, j), where
    D(t) = W_i(a, t] - W_j(a, t] at every event time of i or j in the period, and D(a) = 0."""
    i, j, a, b = joint
    count = (served.position(i, b) - served.position(i, a)) + (served.position(j, b) - served.position(j, a))
    gap, done = 0.0, 0
    bounds = np.cumsum(count)
    while done < i.size:  # in batches of about BATCH_EVENTS events
        stop = max(done + 1, int(np.searchsorted(bounds, bounds[done] - count[done] + BATCH_EVENTS, "right")))
        part = slice(done, stop)
        gap = max(gap, _batch_gap(served, i[part], j[part], a[part], b[part]))
        done = stop
    return gap


def _batch_gap(served: _Served, i, j, a, b) -> float:
    base = served.at(i, a) - served.at(j, a)
    top, bottom = np.zeros(i.size), np.zeros(i.size)  # D(a) = 0 is in every period
    for me, other, sign in ((i, j, 1.0), (j, i, -1.0)):  # D at my events: my service minus the other's
        index, k = _ranges(served.position(me, a), served.position(me, b))
        if not index.size:
            continue
        after = np.searchsorted(served.keys, served.keys[index], "right")  # past my events at that time too
        mine = served.prefix[after] - served.prefix[served.first[me[k]]]
        d = sign * (mine - served.at(other[k], served.times[index])) - base[k]
        starts = np.flatnonzero(np.diff(np.concatenate(([-1], k))))
        groups = k[starts]
        top[groups] = np.maximum(top[groups], np.maximum.reduceat(d, starts))
        bottom[groups] = np.minimum(bottom[groups], np.minimum.reduceat(d, starts))
    return float((top - bottom).max(initial=0.0))


def _contending(served: _Served, periods) -> np.ndarray:
    """Which events came while their client and at least one other were backlogged."""
    client, start, end = periods  # sorted by client, then start
    t, c = served.times, served.client
    backlogged = np.searchsorted(np.sort(start), t, "left") - np.searchsorted(np.sort(end), t, "left")
    grid = np.unique(np.concatenate((start, t)))
    span = grid.size + 1
    k = np.searchsorted(client * span + np.searchsorted(grid, start), c * span + np.searchsorted(grid, t), "left") - 1
    k0 = np.maximum(k, 0)
    own = (k >= 0) & (client[k0] == c) & (t <= end[k0]) if client.size else np.zeros(t.size, dtype=bool)
    return own & (backlogged >= 2)


def fairness_figures(log: ServiceLog, input_weight: float = DEFAULT_WEIGHTS[0],
                     output_weight: float = DEFAULT_WEIGHTS[1]) -> dict:
    """``service_by_client``, ``max_service_gap_tokens``, ``jain_fairness_index`` (all None with
    fewer than two clients; the index also when no client was served while contending)."""
    names = log.names
    if len(names) < 2:
        return dict.fromkeys(FIGURES)
    served = _Served(log, input_weight, output_weight)
    periods = log.periods()
    joint = joint_periods(periods)
    contending = _contending(served, periods)
    shares = np.bincount(served.client[contending], served.weight[contending], minlength=len(names))
    contenders = np.zeros(len(names), dtype=bool)
    contenders[joint[0]] = contenders[joint[1]] = True
    totals = np.bincount(served.client, served.weight, minlength=len(names))
    return {
        "service_by_client": {names[k]: float(totals[k]) for k in sorted(range(len(names)), key=names.__getitem__)},
        "max_service_gap_tokens": max_service_gap(served, joint),
        "jain_fairness_index": jain_index(shares[contenders]),
    }


def jain_index(x) -> float | None:
    """Jain's index (sum x)^2 / (n sum x^2): 1 = all equal, 1/n = one gets everything; None for
    fewer than two values or a zero total."""
    x = np.asarray(x, dtype=float)
    total = x.sum()
    if x.size < 2 or total <= 0:
        return None
    return float(total ** 2 / (x.size * np.square(x).sum()))


class FairnessSeries(NamedTuple):
    """Jain's index per window of engine time (see :func:`fairness_over_time`)."""

    window_start_s: np.ndarray  # [w]: the window (start, start + window_s]
    jain: np.ndarray  # [w]: over the clients contending in the window; NaN when fewer than two or none served
    clients: list[str]  # the rows of ``service``
    service: np.ndarray  # [client, w]: service each client got in the window while contending


def fairness_over_time(records: Iterable[dict] | ServiceLog, window_s: float,
                       input_weight: float = DEFAULT_WEIGHTS[0],
                       output_weight: float = DEFAULT_WEIGHTS[1]) -> FairnessSeries:
    """Jain's index over time (a run's ``requests.jsonl`` records, or a :class:`ServiceLog`): per
    window ``(start, start + window_s]`` of engine time from 0 to the last token, each client's
    service in the window while it and another client were backlogged, over the clients that were
    so in the window (a client that contended and got nothing counts as 0). Plot ``jain`` against
    ``window_start_s``."""
    if not window_s > 0:
        raise ValueError(f"window_s={window_s} must be > 0")
    log = records if isinstance(records, ServiceLog) else ServiceLog.of(records)
    served = _Served(log, input_weight, output_weight)
    n = max(1, math.ceil(served.times.max() / window_s)) if served.times.size else 1
    k = len(log.names)
    service, active = np.zeros((k, n)), np.zeros((k, n), dtype=bool)
    if k >= 2:
        periods = log.periods()
        keep = _contending(served, periods)
        bins = np.clip(np.ceil(served.times[keep] / window_s).astype(np.int64) - 1, 0, n - 1)
        service = np.bincount(served.client[keep] * n + bins, served.weight[keep], minlength=k * n).reshape(k, n)
        i, j, a, b = joint_periods(periods)
        first = np.clip(np.floor(a / window_s), 0, n).astype(np.int64)  # windows overlapping (a, b]
        last = np.clip(np.ceil(np.minimum(b, n * window_s) / window_s), 0, n).astype(np.int64)
        marks = np.zeros(k * (n + 1), dtype=np.int64)
        for c in (i, j):
            np.add.at(marks, c * (n + 1) + first, 1)
            np.add.at(marks, c * (n + 1) + last, -1)
        active = np.cumsum(marks.reshape(k, n + 1), axis=1)[:, :n] > 0
    count, total = active.sum(axis=0), service.sum(axis=0)
    with np.errstate(divide="ignore", invalid="ignore"):
        jain = np.where((count >= 2) & (total > 0), total ** 2 / (count * np.square(service).sum(axis=0)), np.nan)
    return FairnessSeries(np.arange(n) * window_s, jain, list(log.names), service)
