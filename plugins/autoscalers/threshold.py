"""``autoscaler=threshold``: scale on the serving replicas' mean queue and KV use, with hysteresis.

Up by ``step`` replicas when the mean waiting requests per serving replica exceed ``queue_high`` or
the mean KV use exceeds ``kv_high``; down by one (the serving replica with the fewest requests, the
highest index on a tie) when both were below ``queue_low`` and ``kv_low`` at every question for
``cooldown_s`` since the last decision. The gap between high and low is the hysteresis in level, the
cool-down the hysteresis in time: a lull inside a burst retires nothing. No scale-up while a cold
start is under way (its replica will show), no scale-down while one or a drain is (the scale-down
rule is the base class's: :meth:`Autoscaler.scale_up_or_retire`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from servelab.plugin_api import Autoscaler, AutoscaleView, ScaleDown, ScaleUp


class ThresholdAutoscaler(Autoscaler):
    """Hysteresis on queue length and KV use, with a cool-down."""

    name = "threshold"

    @dataclass
    class Config:
        queue_high: float = 4.0  # mean waiting requests per serving replica above which it scales up
        queue_low: float = 0.5  # ... below which (and kv_low) it scales down
        kv_high: float = 0.9  # mean KV use (used / all blocks) above which it scales up
        kv_low: float = 0.3  # ... below which (and queue_low) it scales down
        cooldown_s: float = 30.0  # scale down only after the low marks held this long (and this long after any decision)
        step: int = 1  # replicas added per scale-up

    def __init__(self, config, context) -> None:
        super().__init__(config, context)
        c = self.config
        if not (0 <= c.queue_low <= c.queue_high and 0 <= c.kv_low <= c.kv_high):
            raise ValueError("needs 0 <= queue_low <= queue_high and 0 <= kv_low <= kv_high (the hysteresis)")
        if c.cooldown_s < 0 or c.step < 1:
            raise ValueError("needs cooldown_s >= 0 and step >= 1")

    def decide(self, view: AutoscaleView, now: float) -> Sequence[ScaleUp | ScaleDown]:
        serving = view.serving
        if not serving:
            return ()
        c = self.config
        queue = sum(r.num_waiting for r in serving) / len(serving)
        kv = sum(r.num_used_blocks / max(1, r.num_kv_blocks) for r in serving) / len(serving)
        low = queue < c.queue_low and kv < c.kv_low
        up = None
        if (queue > c.queue_high or kv > c.kv_high) and not view.num_starting and view.num_held < view.max_replicas:
            up = ScaleUp(min(c.step, view.max_replicas - view.num_held))
        return self.scale_up_or_retire(view, now, up, low, c.cooldown_s)
