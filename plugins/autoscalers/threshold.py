"""``autoscaler=threshold``: scale on the serving replicas' mean queue and KV use, with hysteresis.

Up by ``step`` replicas when the mean waiting requests per serving replica exceed ``queue_high`` or
the mean KV use exceeds ``kv_high``; down by one (the serving replica with the fewest requests, the
highest index on a tie) when both are below ``queue_low`` and ``kv_low``. The gap between high and
low is the hysteresis; after any decision nothing more is decided for ``cooldown_s``, and nothing
while a cold start or a drain is under way, so one burst is answered once.
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
        cooldown_s: float = 30.0  # no decision for this long after one
        step: int = 1  # replicas added per scale-up

    def __init__(self, config, context) -> None:
        super().__init__(config, context)
        c = self.config
        if not (0 <= c.queue_low <= c.queue_high and 0 <= c.kv_low <= c.kv_high):
            raise ValueError("needs 0 <= queue_low <= queue_high and 0 <= kv_low <= kv_high (the hysteresis)")
        if c.cooldown_s < 0 or c.step < 1:
            raise ValueError("needs cooldown_s >= 0 and step >= 1")
        self._quiet_until = 0.0

    def decide(self, view: AutoscaleView, now: float) -> Sequence[ScaleUp | ScaleDown]:
        serving = view.serving
        busy = view.num_starting or len(serving) < len(view.replicas)  # a cold start or a drain under way
        if now < self._quiet_until or busy or not serving:
            return ()
        c = self.config
        queue = sum(r.num_waiting for r in serving) / len(serving)
        kv = sum(r.num_used_blocks / max(1, r.num_kv_blocks) for r in serving) / len(serving)
        decision: ScaleUp | ScaleDown | None = None
        if (queue > c.queue_high or kv > c.kv_high) and view.num_held < view.max_replicas:
            decision = ScaleUp(min(c.step, view.max_replicas - view.num_held))
        elif queue < c.queue_low and kv < c.kv_low and view.num_target > view.min_replicas and len(serving) > 1:
            decision = ScaleDown(min(serving, key=lambda r: (r.num_running + r.num_waiting, -r.index)).index)
        if decision is None:
            return ()
        self._quiet_until = now + c.cooldown_s
        return (decision,)
