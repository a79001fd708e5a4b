"""Shortest predicted remaining output first (length-aware scheduling: Qiu et al., "Efficient
Interactive LLM Serving with Proxy-Model-based Sequence Length Prediction", and Fu et al.,
"Efficient LLM Scheduling by Learning to Rank", NeurIPS'24).

Needs a ``length_predictor`` (``oracle``, ``noisy_oracle``, ``learned`` or a plugin); with
``length_predictor=none`` the run refuses to start. Predictions come through
:meth:`Scheduler.predicted_output_len`, asked once per request.

- **Order.** Waiting requests are admitted by predicted *remaining* output (the prediction less
  what the request already generated before a preemption, at least 0), ties by arrival. Running
  requests get the step budget in the same order, so under memory pressure the one predicted to
  run longest is preempted first.
- **Aging bound.** With ``scheduler.max_wait_s=W`` a request that has waited ``W`` seconds since
  it arrived goes ahead of every request that has not (oldest first among them): shortest-first
  otherwise starves long requests under a steady stream of short ones.
- **Preemptive** (``scheduler.preemptive=true``, off by default): a waiting request may take the
  seat or the KV blocks of a running one whose predicted remaining output is larger by more than
  ``scheduler.preempt_margin`` tokens, unless that one is past its aging bound (preemption goes through the configured policy; with
  ``recompute`` the victim's context is prefilled again, which is why it is off by default).
"""

from __future__ import annotations

from dataclasses import dataclass

import math
import sys

from servelab.plugin_api import ConfigError, NextDecision, QueueScheduler, Sequence


@dataclass
class SJFConfig:
    max_wait_s: float | None = None  # a request waiting this long goes first (aging bound); null = none
    preemptive: bool = False  # a waiting request may preempt one predicted to run much longer
    preempt_margin: float = 32.0  # ... longer by more than this many predicted output tokens


class SJFScheduler(QueueScheduler):
    """(predicted remaining output, arrival) order; optionally aged and preemptive."""

    name = "sjf"
    Config = SJFConfig
    needs_length_predictor = True

    def __init__(self, config, *args, **kwargs) -> None:
        if config.max_wait_s is not None and not config.max_wait_s > 0:
            raise ConfigError(f"scheduler.max_wait_s={config.max_wait_s} must be > 0 (or null: no bound)")
        if not config.preempt_margin >= 0:
            raise ConfigError(f"scheduler.preempt_margin={config.preempt_margin} must be >= 0 (tokens)")
        super().__init__(config, *args, **kwargs)

    @property
    def time_dependent_key(self) -> bool:
        return self.config.max_wait_s is not None

    def predicted_remaining(self, seq: Sequence) -> float:
        """Predicted output tokens ``seq`` has still to generate (>= 0)."""
        predicted = self.predicted_output_len(seq)
        if predicted is None:  # only a hand-built stack without a predictor gets here
            raise RuntimeError("scheduler=sjf needs a length_predictor (the stack refuses length_predictor=none)")
        return max(0.0, predicted - seq.num_output_tokens)

    def waiting_key(self):
        if self.config.max_wait_s is None:
            return lambda seq: (self.predicted_remaining(seq), seq.arrival_s)
        bound = self.config.max_wait_s

        def aged(seq: Sequence, now: float):
            if now - seq.arrival_s >= bound:
                return 0, 0.0, seq.arrival_s
            return 1, self.predicted_remaining(seq), seq.arrival_s
        return aged

    def running_order(self, running: list[Sequence], now: float) -> list[Sequence]:
        running.sort(key=lambda seq: (self.predicted_remaining(seq), seq.arrival_s))
        return running

    def next_decision(self, now: float) -> NextDecision:
        """Every remaining prediction falls by one per step, so the running order holds until one
        still above zero reaches zero (ties at zero go by arrival)."""
        if not self.running_sorted_by(lambda seq: (self.predicted_remaining(seq), seq.arrival_s)):
            return NextDecision(0)
        steps = sys.maxsize
        for seq in self.running:
            left = self.predicted_remaining(seq)  # clamped at 0: only those above it can reach it
            if left > 0:
                steps = min(steps, math.ceil(left))
        return NextDecision(steps)

    def may_preempt_for(self, seq: Sequence, victim: Sequence) -> bool:
        if not self.config.preemptive:
            return False
        bound = self.config.max_wait_s
        if bound is not None and self.now - victim.arrival_s >= bound:
            return False  # it waited past the bound once: preempting it again would starve it anew
        return self.predicted_remaining(victim) > self.predicted_remaining(seq) + self.config.preempt_margin
