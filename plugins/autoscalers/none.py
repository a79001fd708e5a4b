"""``autoscaler=none`` (the default): the cluster keeps ``cluster.replicas``; it never asks, prices or
builds anything for scaling, so a run is exactly the one without the kind."""

from __future__ import annotations

from collections.abc import Sequence

from servelab.plugin_api import Autoscaler, AutoscaleView, ScaleDown, ScaleUp


class NoAutoscaler(Autoscaler):
    """Never scales."""

    name = "none"
    scales = False

    def decide(self, view: AutoscaleView, now: float) -> Sequence[ScaleUp | ScaleDown]:
        return ()
