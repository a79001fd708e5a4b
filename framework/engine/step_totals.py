"""Run-wide sums over every step, kept as the run goes (so a run need not keep its steps)."""

from __future__ import annotations

from dataclasses import dataclass, field


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

    def add(self, record) -> None:
        """Fold in one :class:`~servelab.engine.engine.StepRecord`."""
        self.num_steps += 1
        self.last_time_s = record.time_s
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

    @property
    def kv_utilization_mean(self) -> float:
        return self.kv_utilization_sum / self.num_steps if self.num_steps else 0.0

    def gauge_mean(self, key: str) -> float:
        n = self.gauge_counts.get(key, 0)
        return self.gauge_sums[key] / n if n else 0.0
