"""``autoscaler=slo``: scale up when the predicted first-token latency exceeds a target.

The prediction for a request arriving now on a serving replica: it waits at least as long as the
request there that has waited longest for its first token has waited so far (a queue held up by
full KV blocks shows here), and at least until the tokens before every first token there (the
view's ``prefill_backlog_tokens``: queued, preempted and part-prefilled requests) are computed; then
its own prompt (the mean prompt of the
requests in view). Tokens are priced at the replica's prefill rate (``context.prefill_tokens_per_s``,
its time model's price of a full prefill chunk); the prediction is averaged over the serving
replicas (a router spreads new requests). Above ``ttft_ms``: add enough replicas to clear the cluster's queue within the target
(at most ``max_step``). Below ``low_fraction`` x the target with mean KV use below ``kv_low``:
retire the emptiest serving replica, once that held at every question for ``cooldown_s`` since the
last decision (a lull inside a burst retires nothing). No scale-up while a cold start is under way
(its replica will show), no scale-down while one or a drain is (the scale-down rule is the base
class's: :meth:`Autoscaler.scale_up_or_retire`). It ignores prefix-cache hits (it over-predicts when they hit).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from servelab.plugin_api import Autoscaler, AutoscaleView, ReplicaLoad, ScaleDown, ScaleUp


class SLOAutoscaler(Autoscaler):
    """Predicted first-token latency against a target."""

    name = "slo"

    @dataclass
    class Config:
        ttft_ms: float = 2000.0  # the first-token latency target
        low_fraction: float = 0.25  # scale down below this share of the target ...
        kv_low: float = 0.4  # ... while the mean KV use is below this
        cooldown_s: float = 30.0  # scale down only after the low marks held this long (and this long after any decision)
        max_step: int = 4  # most replicas added at once

    def __init__(self, config, context) -> None:
        super().__init__(config, context)
        c = self.config
        if c.ttft_ms <= 0 or not 0 <= c.low_fraction < 1 or not 0 <= c.kv_low <= 1:
            raise ValueError("needs ttft_ms > 0, 0 <= low_fraction < 1 and 0 <= kv_low <= 1")
        if c.cooldown_s < 0 or c.max_step < 1:
            raise ValueError("needs cooldown_s >= 0 and max_step >= 1")
        if context.prefill_tokens_per_s <= 0:
            raise ValueError("the cluster gave no prefill rate (context.prefill_tokens_per_s) to predict with")

    def predicted_ttft_s(self, view: AutoscaleView) -> tuple[float, float]:
        """(the predicted first-token latency of a request arriving now, the cluster's queued prompt tokens)."""
        serving = view.serving
        seen = [q for r in view.replicas for q in (*r.running, *r.waiting)]
        prompt = sum(q.prompt_len for q in seen) / len(seen) if seen else 0.0
        rate = self.context.prefill_tokens_per_s
        waits = dict(zip((r.index for r in view.replicas), view.first_token_wait_s))
        backlog = dict(zip((r.index for r in view.replicas), view.prefill_backlog_tokens))
        queued = [backlog.get(r.index, _queued_tokens(r)) for r in serving]
        each = [max(waits.get(r.index, 0.0), q / rate) + prompt / rate for r, q in zip(serving, queued)]
        return sum(each) / len(serving), float(sum(queued))

    def decide(self, view: AutoscaleView, now: float) -> Sequence[ScaleUp | ScaleDown]:
        serving = view.serving
        if not serving:
            return ()
        c = self.config
        target_s = c.ttft_ms / 1e3
        predicted, queued = self.predicted_ttft_s(view)
        kv = sum(r.num_used_blocks / max(1, r.num_kv_blocks) for r in serving) / len(serving)
        low = predicted < c.low_fraction * target_s and kv < c.kv_low
        up = None
        if predicted > target_s and not view.num_starting and view.num_held < view.max_replicas:
            needed = math.ceil(queued / (self.context.prefill_tokens_per_s * target_s)) - view.num_target
            up = ScaleUp(max(1, min(needed, c.max_step, view.max_replicas - view.num_held)))
        return self.scale_up_or_retire(view, now, up, low, c.cooldown_s)


def _queued_tokens(r: ReplicaLoad) -> int:
    """Every queued request's tokens on ``r`` (where the view gives no backlog: a view made by hand)."""
    return sum(q.num_tokens for q in r.waiting)
