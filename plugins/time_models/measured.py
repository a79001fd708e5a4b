"""``time_model=measured``: the wall clock's own answer (a step takes what it takes)."""

from __future__ import annotations

from servelab.plugin_api import TimeModel


class MeasuredTime(TimeModel):
    """No model: steps are timed on the wall clock. Only valid with ``clock=wall``."""

    name = "measured"
    measured = True

    def predict(self, work) -> float:
        raise RuntimeError("time_model=measured does not predict: steps are timed on the wall clock")
