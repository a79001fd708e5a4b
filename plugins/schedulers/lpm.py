"""Longest prefix match first: prefix-cache-aware admission (SGLang's ``lpm`` policy: Zheng et al.,
"SGLang: Efficient Execution of Structured Language Model Programs", NeurIPS'24, section 3).

Needs a prefix cache to matter (``allocator.prefix_caching=true``); without one every request
matches 0 tokens and the order is first come, first served.

- **Order.** Every step, the ``scheduler.max_scan`` (128) oldest waiting requests are ranked by
  how many leading tokens the prefix cache holds for each right now
  (``allocator.cached_prefix_len``; longest first, ties by arrival); the rest wait behind them in
  arrival order. The ranking is redone every step the scheduler tries to admit someone (running
  requests add blocks to the cache, admissions evict them), and skipped while every seat is
  taken. SGLang ranks the whole queue and drops to FCFS once more than 128 wait; ranking a
  window of the oldest instead keeps the cost per step bounded (at most ``max_scan`` walks of
  the allocator's digests, memoised per waiting request: dict look-ups; a prompt is hashed once)
  without giving up the policy under load, when it matters most.
- **Starvation bound.** ``scheduler.max_wait_s=W`` (off by default, as in SGLang and this repo's
  ``sjf`` and ``mlfq``): a request that has waited ``W`` seconds since it arrived goes ahead of all
  that have not, oldest first. Without it a request sharing nothing can in principle be passed
  over for as long as requests with cache hits keep coming. It is off by default because a fixed
  bound shorter than the queueing delay turns the order back into FCFS exactly when queues are
  long, which is where LPM gains (on the Mooncake conversation trace in the simulator, ``W=30``
  made ``lpm`` identical to ``fcfs`` at 2x and 1x the trace's rate), while without it the
  requests there that share nothing waited no longer than under FCFS (docs/policies.md).
- **Groups** (``scheduler.group_by_prefix=true``, off by default; SGLang's ``dfs-weight``). The
  ranked window is put in the depth-first order of the tree its cached prefixes form (each
  request hangs where its cached prefix ends; a node's weight is how many ranked requests hang in
  its subtree, plus one on the prompt path of the request admitted last, so that a group being
  admitted is continued rather than a group of equal size): at each node heavier subtrees first
  (ties: the one holding the oldest request), deeper requests before those ending at the node,
  arrival order among those ending at the same node; requests with nothing cached come last, in
  arrival order. Requests sharing a cached
  prefix are thus admitted together, the largest group first, while their shared blocks are
  held. Tree nodes are the scheduler's own chained keys of the prompt's full blocks (Python
  hashes, extended lazily and memoised per request; a collision could only merge two groups in
  the order).

It only orders admission: what each request computes, the plan contract and preemption (through
the configured policy, newest admitted first) are those of :class:`QueueScheduler`.
"""

from __future__ import annotations

import bisect
import itertools
from collections import deque
from dataclasses import dataclass
from typing import Callable, Iterable, Iterator

from servelab.plugin_api import UNTIL_ARRIVAL, ConfigError, NextDecision, QueueScheduler, Sequence


@dataclass
class LPMConfig:
    max_scan: int = 128  # rank at most this many oldest waiting requests per step; the rest wait FCFS
    max_wait_s: float | None = None  # a request waiting this long goes first (starvation bound); null = none
    group_by_prefix: bool = False  # SGLang's dfs-weight: keep requests sharing a cached prefix together


class ArrivalQueue:
    """Waiting sequences in arrival order (ties: the order they were first pushed), with a front
    ranked once per step.

    ``rank(window)`` gets the ``max_scan`` oldest in arrival order and returns them in admission
    order; it runs at the first :meth:`peek` after :meth:`rekey`. ``push_front`` puts a sequence at
    the head until the next ranking.
    """

    def __init__(self, rank: Callable[[list[Sequence]], list[Sequence]], max_scan: int) -> None:
        self._rank = rank
        self._max_scan = max_scan
        self._entries: list[tuple[float, int, Sequence]] = []  # sorted by (arrival, first push)
        self._numbers: dict[str, int] = {}  # seq id -> first-push number, kept until forget()
        self._counter = itertools.count()
        self._front: deque[Sequence] = deque()  # this step's ranked head
        self._stale = True

    def _key(self, seq: Sequence) -> tuple[float, int]:
        number = self._numbers.get(seq.id)
        if number is None:
            number = self._numbers[seq.id] = next(self._counter)
        return seq.arrival_s, number

    def push(self, seq: Sequence) -> None:
        bisect.insort(self._entries, (*self._key(seq), seq))

    def push_front(self, seq: Sequence) -> None:
        self.push(seq)
        if not self._stale:
            self._front.appendleft(seq)

    def rekey(self) -> None:
        self._stale = True

    def peek(self) -> Sequence:
        if self._stale:
            self._front = deque(self._rank([e[2] for e in self._entries[:self._max_scan]]))
            self._stale = False
        return self._front[0] if self._front else self._entries[0][2]

    def pop(self) -> Sequence:
        seq = self.peek()
        if self._front:
            self._front.popleft()
        self._delete(seq)
        return seq

    def remove(self, seq: Sequence) -> None:
        self._delete(seq)
        self._front = deque(s for s in self._front if s is not seq)

    def forget(self, seq: Sequence) -> None:
        """``seq`` ended: drop its first-push number."""
        self._numbers.pop(seq.id, None)

    def _delete(self, seq: Sequence) -> None:
        i = bisect.bisect_left(self._entries, self._key(seq))
        if i == len(self._entries) or self._entries[i][2] is not seq:
            raise ValueError(f"sequence {seq.id!r} is not waiting")
        del self._entries[i]

    def __iter__(self) -> Iterator[Sequence]:
        """Every waiting sequence: the ranked front, then the rest in arrival order."""
        front = {id(s) for s in self._front}
        return itertools.chain(self._front, (e[2] for e in self._entries if id(e[2]) not in front))

    def __len__(self) -> int:
        return len(self._entries)


def dfs_weight_order(paths: list[list[int]], last: Iterable[int] = ()) -> list[int]:
    """Indices of requests (given in arrival order, each with the node keys of its cached prefix,
    root first) in depth-first order of the tree the paths form: heavier subtrees first (ties: the
    one holding the earliest request), deeper before shallower, then arrival. Each node on the
    path ``last`` weighs one more."""
    weight: dict[int, int] = dict.fromkeys(last, 1)
    oldest: dict[int, int] = {}
    for i, path in enumerate(paths):
        for node in path:
            weight[node] = weight.get(node, 0) + 1
            oldest.setdefault(node, i)

    def position(i: int) -> list[tuple[int, ...]]:
        # (0, ...) sorts before the end marker (1, i): a request that goes deeper comes first
        return [(0, -weight[node], oldest[node]) for node in paths[i]] + [(1, i)]
    return sorted(range(len(paths)), key=position)


class LPMScheduler(QueueScheduler):
    """Admission by longest cached prefix among the oldest ``max_scan`` waiting; aged requests first."""

    name = "lpm"
    Config = LPMConfig
    time_dependent_key = True  # the cache changes every step: the queue is re-ranked (rekey) each step

    def __init__(self, config, *args, **kwargs) -> None:
        if not (isinstance(config.max_scan, int) and config.max_scan >= 1):
            raise ConfigError(f"scheduler.max_scan={config.max_scan} must be an integer >= 1 "
                              "(requests ranked per step)")
        if config.max_wait_s is not None and not config.max_wait_s > 0:
            raise ConfigError(f"scheduler.max_wait_s={config.max_wait_s} must be > 0 (or null: no bound)")
        self._keys: dict[str, list[int]] = {}  # seq id -> chained keys of its leading full blocks (groups)
        self._last_path: list[int] = []  # keys of the prompt blocks of the request admitted last (groups)
        super().__init__(config, *args, **kwargs)

    def make_waiting_queue(self) -> ArrivalQueue:
        return ArrivalQueue(self.rank, self.config.max_scan)

    def rank(self, window: list[Sequence]) -> list[Sequence]:
        """``window`` (the oldest waiting, in arrival order) in admission order at ``self.now``."""
        bound, now = self.config.max_wait_s, self.now
        aged = 0
        if bound is not None:
            while aged < len(window) and now - window[aged].arrival_s >= bound:
                aged += 1
        if len(self.running) >= self.limits.max_num_seqs:
            return window  # no seat and no preemption for one: nobody is admitted, skip the look-ups
        rest = window[aged:]
        cached = [self.allocator.cached_prefix_len(seq) for seq in rest]
        if self.config.group_by_prefix:
            size = self.allocator.block_size
            order = dfs_weight_order([self._block_keys(seq, c // size) for seq, c in zip(rest, cached)],
                                     self._last_path)
        else:
            order = sorted(range(len(rest)), key=lambda j: (-cached[j], j))
        return window[:aged] + [rest[j] for j in order]

    def _block_keys(self, seq: Sequence, n: int) -> list[int]:
        """Chained keys of ``seq``'s first ``n`` full blocks. A key depends only on the tokens up
        to its block's end, which never change: the memo is only ever extended."""
        keys = self._keys.setdefault(seq.id, [])
        if len(keys) < n:
            size, tokens = self.allocator.block_size, seq.token_ids
            parent = keys[-1] if keys else hash((seq.request.cache_salt,))
            for j in range(len(keys), n):
                parent = hash((parent, tuple(tokens[j * size:(j + 1) * size])))
                keys.append(parent)
        return keys[:n]

    def next_decision(self, now: float) -> NextDecision:
        return UNTIL_ARRIVAL  # it ranks only the waiting; the running keep their order

    def on_admit(self, seq: Sequence, now: float) -> None:
        if self.config.group_by_prefix:
            self._last_path = self._block_keys(seq, (seq.num_tokens - 1) // self.allocator.block_size)
        self._keys.pop(seq.id, None)

    def remove(self, seq: Sequence) -> None:
        self._keys.pop(seq.id, None)
        self.waiting.forget(seq)
        super().remove(seq)
