"""Sums over steps, the one place step records are added up: a run's totals (kept as the run goes,
so a run need not keep its steps), a cluster's (every replica's totals merged), and the logger's
window of steps."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from servelab.engine.engine import StepRecord


@dataclass
class StepTotals:
    """What the summary needs from the steps: counts, sums, maxima and gauge means."""

    num_steps: int = 0
    last_time_s: float = 0.0
    kv_utilization_sum: float = 0.0
    kv_utilization_max: float = 0.0
    preemptions: dict[str, int] = field(default_factory=dict)
    recomputed_tokens: int = 0  # KV discarded by recompute preemptions
    prefill_tokens: int = 0
    max_concurrent: int = 0
    swap_out_blocks: int = 0
    swap_in_blocks: int = 0
    model_s: float = 0.0
    comm_s: float = 0.0
    busy_s: float = 0.0  # the steps' durations summed (the engine's busy time on its clock)
    gauge_sums: dict[str, float] = field(default_factory=dict)
    gauge_counts: dict[str, int] = field(default_factory=dict)
    num_seqs: int = 0  # the steps' batch sizes summed (num_seqs / num_steps: the mean batch)
    num_tokens: int = 0
    decode_seqs: int = 0
    draft_tokens: int = 0  # speculative drafts verified
    accepted_tokens: int = 0  # of which kept

    def add(self, record: StepRecord) -> None:
        """Fold in one :class:`~servelab.engine.engine.StepRecord`."""
        self.num_steps += 1
        self.last_time_s = record.time_s
        self.num_seqs += record.num_seqs
        self.num_tokens += record.num_tokens
        self.decode_seqs += record.decode_seqs
        if record.draft_tokens:
            self.draft_tokens += record.draft_tokens
            self.accepted_tokens += record.accepted_tokens
        self.kv_utilization_sum += record.kv_utilization
        if record.kv_utilization > self.kv_utilization_max:
            self.kv_utilization_max = record.kv_utilization
        for p in record.preempted:
            self.preemptions[p.kind] = self.preemptions.get(p.kind, 0) + 1
            if p.kind == "recompute":
                self.recomputed_tokens += p.num_computed_tokens
        self.prefill_tokens += record.prefill_tokens
        if record.num_seqs > self.max_concurrent:
            self.max_concurrent = record.num_seqs
        self.swap_out_blocks += record.swap_out_blocks
        self.swap_in_blocks += record.swap_in_blocks
        self.model_s += record.model_s
        self.comm_s += record.comm_s
        self.busy_s += record.duration_s
        for k, v in record.extra.items():
            if v is not None:
                self.gauge_sums[k] = self.gauge_sums.get(k, 0.0) + v
                self.gauge_counts[k] = self.gauge_counts.get(k, 0) + 1

    def add_decode_step(self, time_s: float, duration_s: float, num_seqs: int, kv_utilization: float,
                        extra: dict[str, float]) -> None:
        """:meth:`add` of a step that decoded ``num_seqs`` sequences and did nothing else, without a
        record (the simulator's fast-forward, when no listener reads one): the same sums in the
        same order, so the totals are bit for bit what :meth:`add` makes."""
        self.num_steps += 1
        self.last_time_s = time_s
        self.num_seqs += num_seqs
        self.num_tokens += num_seqs
        self.decode_seqs += num_seqs
        self.kv_utilization_sum += kv_utilization
        if kv_utilization > self.kv_utilization_max:
            self.kv_utilization_max = kv_utilization
        if num_seqs > self.max_concurrent:
            self.max_concurrent = num_seqs
        self.model_s += 0.0
        self.comm_s += 0.0
        self.busy_s += duration_s
        for k, v in extra.items():
            if v is not None:
                self.gauge_sums[k] = self.gauge_sums.get(k, 0.0) + v
                self.gauge_counts[k] = self.gauge_counts.get(k, 0) + 1

    def merge(self, other: StepTotals) -> None:
        """Fold in the totals of an engine that ran beside this one (a cluster's replicas): counts
        and sums added, maxima and the last step's time the largest; ``max_concurrent`` becomes the
        sum of the peaks (an upper bound on the joint peak: the peaks need not coincide)."""
        self.num_steps += other.num_steps
        self.last_time_s = max(self.last_time_s, other.last_time_s)
        self.kv_utilization_sum += other.kv_utilization_sum
        self.kv_utilization_max = max(self.kv_utilization_max, other.kv_utilization_max)
        for kind, n in other.preemptions.items():
            self.preemptions[kind] = self.preemptions.get(kind, 0) + n
        self.recomputed_tokens += other.recomputed_tokens
        self.prefill_tokens += other.prefill_tokens
        self.max_concurrent += other.max_concurrent
        self.swap_out_blocks += other.swap_out_blocks
        self.swap_in_blocks += other.swap_in_blocks
        self.model_s += other.model_s
        self.comm_s += other.comm_s
        self.busy_s += other.busy_s
        for k, v in other.gauge_sums.items():
            self.gauge_sums[k] = self.gauge_sums.get(k, 0.0) + v
            self.gauge_counts[k] = self.gauge_counts.get(k, 0) + other.gauge_counts[k]
        self.num_seqs += other.num_seqs
        self.num_tokens += other.num_tokens
        self.decode_seqs += other.decode_seqs
        self.draft_tokens += other.draft_tokens
        self.accepted_tokens += other.accepted_tokens

    @classmethod
    def merged(cls, parts: Iterable[StepTotals]) -> StepTotals:
        """The totals of engines that ran side by side (:meth:`merge` over ``parts``)."""
        total = cls()
        for part in parts:
            total.merge(part)
        return total

    @property
    def num_preemptions(self) -> int:
        return sum(self.preemptions.values())

    @property
    def kv_utilization_mean(self) -> float:
        return self.kv_utilization_sum / self.num_steps if self.num_steps else 0.0

    def gauge_mean(self, key: str) -> float:
        n = self.gauge_counts.get(key, 0)
        return self.gauge_sums[key] / n if n else 0.0
