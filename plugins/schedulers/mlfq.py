"""Skip-join multi-level feedback queue (FastServe: Wu et al., "Fast Distributed Inference
Serving for Large Language Models", 2023): approximate shortest-job-first without knowing
output lengths.

- **Levels.** ``scheduler.quanta = [q0, q1, ...]`` (strictly increasing, in output tokens: one
  decode iteration each): a request at level ``i`` may generate ``q_i`` tokens there, then drops
  to level ``i + 1``. The last level keeps what it gets (no further demotion). Lower level =
  served first; within a level, earlier arrival first.
- **Skip-join.** A new request does not start at the top: its first iteration (the prefill)
  costs, by the shared step-cost model, as much as ``prompt_cost`` decode iterations, and it
  joins the first level whose quantum covers that (FastServe's rule: a long prompt would use up a
  small quantum in its first iteration anyway). With ``scheduler.use_length_predictor=true`` and
  a ``length_predictor``, it joins the first level whose quantum covers its predicted output.
- **Preemption at quantum boundaries.** A waiting request may take the seat or the KV blocks of a
  running one at a strictly lower level (one that has used up its quanta), through the
  configured ``preemption`` policy: ``swap`` keeps the victim's KV on the host (a copy each
  way), ``recompute`` throws it away and the victim's whole context is prefilled again when it
  returns, which at high load and long contexts can cost more than the reordering gains. A
  request still computing its context (its prompt, or a recompute after an earlier preemption)
  is not preempted: that would throw the work away again. Swapped-out requests come back in the
  order they left, before anyone new is admitted (``QueueScheduler``'s rule), whatever their
  level; and a step that swaps in cannot swap out, so a victim in such a step is recomputed.
- **Starvation bound.** With ``scheduler.max_wait_s=W`` a request that has waited ``W`` seconds
  (since it arrived, or since it was preempted) is promoted to level 0 with a fresh quantum
  (FastServe promotes long-waiting jobs the same way); the conformance kit holds the bound.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import sys

from servelab.plugin_api import ConfigError, NextDecision, QueueScheduler, Sequence, StepFeatures


@dataclass
class MLFQConfig:
    quanta: list[int] = field(default_factory=lambda: [4, 16, 64, 256, 1024])  # output tokens per level
    skip_join: bool = True  # join the level the prompt's cost implies (False: every request joins level 0)
    use_length_predictor: bool = False  # join by predicted output length (needs length_predictor=...)
    max_wait_s: float | None = None  # promote a request waiting this long to level 0; null = no bound


class MLFQScheduler(QueueScheduler):
    """(level, arrival) order for admission, budget and preemption; levels from token quanta."""

    name = "mlfq"
    Config = MLFQConfig

    def __init__(self, config, *args, **kwargs) -> None:
        quanta = list(config.quanta)
        if not quanta or any(not isinstance(q, int) or q < 1 for q in quanta) or any(
                b <= a for a, b in zip(quanta, quanta[1:])):
            raise ConfigError(f"scheduler.quanta={quanta} must be a non-empty list of strictly increasing "
                              f"integers >= 1 (output tokens per level)")
        if config.max_wait_s is not None and not config.max_wait_s > 0:
            raise ConfigError(f"scheduler.max_wait_s={config.max_wait_s} must be > 0 (or null: no bound)")
        self.quanta = quanta
        # Per sequence (dropped in remove): its level, its output count when it entered the
        # level, and since when it waits (arrival or preemption).
        self.level: dict[str, int] = {}
        self._level_start: dict[str, int] = {}
        self._waiting_since: dict[str, float] = {}
        super().__init__(config, *args, **kwargs)

    @property
    def time_dependent_key(self) -> bool:
        return self.config.max_wait_s is not None

    # ---- levels -------------------------------------------------------------------------
    def join_level(self, seq: Sequence) -> int:
        """The level a new request joins (skip-join)."""
        if self.config.use_length_predictor:
            predicted = self.predicted_output_len(seq)
            if predicted is not None:
                return self._first_level_covering(predicted)
        if not self.config.skip_join:
            return 0
        return self._first_level_covering(self.prompt_cost(seq.request.prompt_len))

    def prompt_cost(self, prompt_len: int) -> float:
        """The prefill of ``prompt_len`` tokens in decode iterations of one sequence, by the
        shared step-cost model (its prior before any step is measured)."""
        model = self.cost_model
        decode = model.predict(StepFeatures(decode_seqs=1, attended_context=prompt_len))
        prefill = model.predict(StepFeatures(prefill_tokens=prompt_len,
                                             attended_context=prompt_len * (prompt_len + 1) // 2))
        return prefill / decode if decode > 0 else float(prompt_len)

    def _first_level_covering(self, cost: float) -> int:
        for i, quantum in enumerate(self.quanta):
            if quantum >= cost:
                return i
        return len(self.quanta) - 1

    def effective_level(self, seq: Sequence, now: float) -> int:
        """``seq``'s level, or 0 once it has waited ``max_wait_s`` (it is promoted when admitted)."""
        level = self.level[seq.id]
        bound = self.config.max_wait_s
        if bound is not None and seq.id in self._waiting_since and now - self._waiting_since[seq.id] >= bound:
            return 0
        return level

    def _demote(self, seq: Sequence) -> None:
        """Move ``seq`` down past every quantum its output since entering its level used up."""
        sid, last = seq.id, len(self.quanta) - 1
        level, start = self.level[sid], self._level_start[sid]
        while level < last and seq.num_output_tokens - start >= self.quanta[level]:
            start += self.quanta[level]
            level += 1
        self.level[sid], self._level_start[sid] = level, start

    # ---- policy hooks -------------------------------------------------------------------
    def add(self, seq: Sequence) -> None:
        self.level[seq.id] = self.join_level(seq)
        self._level_start[seq.id] = seq.num_output_tokens
        self._waiting_since[seq.id] = seq.arrival_s
        super().add(seq)

    def waiting_key(self):
        if self.config.max_wait_s is None:
            return lambda seq: (self.level[seq.id], seq.arrival_s)
        return lambda seq, now: (self.effective_level(seq, now), seq.arrival_s)

    def on_admit(self, seq: Sequence, now: float) -> None:
        if self.effective_level(seq, now) < self.level[seq.id]:  # promoted: a fresh quantum at the top
            self.level[seq.id], self._level_start[seq.id] = 0, seq.num_output_tokens
        self._waiting_since.pop(seq.id, None)

    def running_order(self, running: list[Sequence], now: float) -> list[Sequence]:
        waiting_since = self._waiting_since
        for seq in running:
            self._demote(seq)
            waiting_since.pop(seq.id, None)  # back from a swap: it runs again
        level = self.level
        running.sort(key=lambda seq: (level[seq.id], seq.arrival_s))
        return running

    def next_decision(self, now: float) -> NextDecision:
        """The running order changes when a running sequence uses up its quantum: ask then (and
        at once when a newly admitted one belongs further up)."""
        levels = self.level
        if not self.running_sorted_by(lambda seq: (levels[seq.id], seq.arrival_s)):
            return NextDecision(0)
        last, steps = len(self.quanta) - 1, sys.maxsize
        for seq in self.running:
            level = self.level[seq.id]
            if level < last:
                steps = min(steps, self.quanta[level] - (seq.num_output_tokens - self._level_start[seq.id]))
        return NextDecision(max(0, steps))

    def may_preempt_for(self, seq: Sequence, victim: Sequence) -> bool:
        if victim.num_computed_tokens < victim.num_tokens - 1:  # mid-prefill or mid-recompute: keep its work
            return False
        return self.level[victim.id] > self.effective_level(seq, self.now)

    def _preempt(self, victim: Sequence, plan) -> None:
        super()._preempt(victim, plan)
        self._waiting_since[victim.id] = self.now  # waits again from now (recompute or swap)

    def remove(self, seq: Sequence) -> None:
        for state in (self.level, self._level_start, self._waiting_since):
            state.pop(seq.id, None)
        super().remove(seq)

    def step_stats(self) -> dict[str, float]:
        stats = super().step_stats()
        if self.running:
            stats["mlfq_mean_running_level"] = sum(self.level[s.id] for s in self.running) / len(self.running)
        return stats
