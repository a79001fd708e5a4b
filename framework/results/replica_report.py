"""What a cluster's summary needs from each replica, as plain data: read off a live engine (the
simulator's cluster, in this process) or sent by an engine process when it stops (the wall-clock
cluster), so both kinds of cluster make ``summary.json`` the same way (:mod:`servelab.run.cluster_run`)."""

from __future__ import annotations

from dataclasses import dataclass, field

from servelab.engine.step_totals import StepTotals
from servelab.kv.tiers.cluster_figures import replica_tier_report
from servelab.results.writer import kv_pool_metrics
from servelab.assemble.stack import Stack


@dataclass
class ReplicaReport:
    """One replica's step totals, pool, executor and clock figures. ``leaked_blocks`` is None while
    requests are live on it (a partial run); a replica that died before reporting is :meth:`empty`."""

    totals: StepTotals = field(default_factory=StepTotals)
    leaked_blocks: int | None = None
    num_kv_blocks: int = 0
    bytes_per_block: int = 0
    num_swap_blocks: int = 0
    kv_pool_blocks: int = 0
    kv_pool_bytes: int = 0
    swap_bytes_per_s: float = 0.0
    block_size: int = 0
    cost_model: dict = field(default_factory=dict)
    executor_summary: dict = field(default_factory=dict)
    time: dict = field(default_factory=dict)
    block_size_auto: dict | None = None
    steps: list = field(default_factory=list)  # its StepRecords (debug.log_steps)
    kv_tiers: dict = field(default_factory=dict)  # its KV tier figures ({}: no tiers)
    timeline: dict = field(default_factory=dict)  # its StepTimeline's columns ({}: none kept)

    @classmethod
    def of(cls, stack: Stack, live: bool) -> "ReplicaReport":
        """The report of ``stack``'s engine now (``live``: requests have not ended on it)."""
        engine, executor = stack.engine, stack.executor
        pool = kv_pool_metrics(executor)
        return cls(engine.totals, None if live else engine.allocator.leaked_blocks(), engine.allocator.num_blocks,
                   executor.bytes_per_block, executor.num_swap_blocks, pool["kv_pool_blocks"], pool["kv_pool_bytes"],
                   engine.cost_model.swap_bytes_per_s or 0.0, engine.limits.block_size,
                   engine.cost_model.coefficients, executor.summary(), stack.describe_time(), stack.block_size_auto,
                   list(engine.steps), replica_tier_report(engine.connector),
                   engine.timeline.columns() if engine.timeline is not None else {})
