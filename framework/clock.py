"""Clocks the engine runs on.

- :class:`WallClock`: ``time.perf_counter``; a step takes what it takes; idle waits sleep.
- :class:`ModelledClock` (``clock=virtual``): time moves only by the time model's prediction for
  each executed step, and idle waits jump straight to the next arrival. Every metric is then a
  function of config + workload + seed, whatever else the machine is doing.

A clock is called for the current time and has ``sleep(seconds)`` (idle) and
``end_step(work)`` (after a step ran). Any callable with those works
(``servelab.testing.VirtualClock`` is moved by a fake executor instead).
"""

from __future__ import annotations

import time

from .interfaces import TimeModel
from .step_work import StepWork


class WallClock:
    kind = "wall"

    def __call__(self) -> float:
        return time.perf_counter()

    def sleep(self, seconds: float) -> None:
        time.sleep(min(max(seconds, 0.0), 0.5))  # short naps: a caller may have more to do

    def end_step(self, work: StepWork) -> None:
        pass


class ModelledClock:
    """Virtual time advanced by ``time_model.predict`` for each step."""

    kind = "virtual"

    def __init__(self, time_model: TimeModel) -> None:
        if time_model.measured:
            raise ValueError(f"clock=virtual needs a time model that predicts; time_model={time_model.name!r} "
                             "only measures (use time_model=roofline or time_model=profile)")
        self.time_model = time_model
        self.t = 0.0

    def __call__(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            self.t += seconds

    def end_step(self, work: StepWork) -> None:
        self.t += self.time_model.predict(work)
