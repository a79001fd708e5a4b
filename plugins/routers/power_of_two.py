"""``router=power_of_two``: sample two replicas at random, send the request to the less loaded.

Mitzenmacher's "power of two choices" (The Power of Two Choices in Randomized Load Balancing,
IEEE TPDS 2001): two random probes instead of one cut the most loaded bin from
O(log n / log log n) to O(log log n) above the mean, while a router probes only two replicas per
request (what large fleets do when querying every replica's load is too costly or too stale).
``router.choices=d`` samples ``d`` (power of d choices); ``router.by=tokens`` compares outstanding
tokens instead of requests. Candidates are the replicas that can hold the request, sampled
without replacement from ``random.Random(context.seed)``; ties go to the lower index; with no
more candidates than ``choices``, the least loaded of them all.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from servelab.plugin_api import ReplicaView, Request, Router
from servelab.plugins.routers.least_outstanding import least_loaded, load_of


@dataclass
class PowerOfTwoConfig:
    choices: int = 2  # replicas sampled per request (d of "power of d choices")
    by: str = "requests"  # "requests" (num_outstanding) or "tokens" (their prompt + max_tokens)


class PowerOfTwoRouter(Router):
    """The less loaded of ``choices`` replicas sampled at random among those that can hold the request."""

    name = "power_of_two"
    Config = PowerOfTwoConfig

    def __init__(self, config: PowerOfTwoConfig, context) -> None:
        super().__init__(config, context)
        if config.choices < 1:
            raise ValueError(f"router.choices={config.choices} must be >= 1")
        self.load = load_of(config.by)
        self.rng = random.Random(context.seed)

    def route(self, request: Request, replicas: Sequence[ReplicaView], now: float) -> int:
        candidates = [v for v in replicas if v.can_hold]
        if len(candidates) > self.config.choices:
            candidates = self.rng.sample(candidates, self.config.choices)
        return least_loaded(candidates, self.load)
