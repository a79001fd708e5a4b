"""Clocks the engine runs on.

- :class:`WallClock`: ``time.perf_counter``; a step takes what it takes; idle waits sleep.
- :class:`ModelledClock` (``clock=virtual``): time moves only by the time model's prediction for
  each executed step, and idle waits jump straight to the next arrival. Every metric is then a
  function of config + workload + seed, whatever else the machine is doing.

Anything with the :class:`Clock` protocol's four methods works
(``servelab.kit.testing.VirtualClock`` is moved by a fake executor instead).
"""

from __future__ import annotations

import time
from typing import Protocol, runtime_checkable

from servelab.core.interfaces import TimeModel
from servelab.core.kv_connector import KVTransferTime
from servelab.core.step_work import DraftWork, StepWork


def price_kv_transfer(clock: Clock, compute_s: float, transfer: KVTransferTime) -> tuple[float, float]:
    """``(added_s, hidden_s)``: what a step's KV loads add to the step on ``clock`` and what its
    ``compute_s`` hides, the same rule for every connector. A virtual clock (``kind == "virtual"``)
    advances by the added seconds: all of the load when it is serialised, what compute does not hide
    when it overlaps. Any other clock measured the copies as they ran: nothing is added."""
    load_s = transfer.load_s
    if getattr(clock, "kind", None) != "virtual":
        return 0.0, 0.0
    added = max(0.0, load_s - compute_s) if transfer.overlap else load_s
    clock.sleep(added)
    return added, load_s - added


@runtime_checkable
class Clock(Protocol):
    """What the engine's one ``clock`` attribute must do."""

    def now(self) -> float:
        """Seconds on this clock (any origin: the engine subtracts its start)."""

    def sleep(self, seconds: float) -> None:
        """Nothing can run for up to ``seconds``: nap, or jump in virtual time."""

    def end_step(self, work: StepWork) -> None:
        """A step described by ``work`` just ran (a virtual clock advances by its predicted time)."""

    def end_draft(self, draft: DraftWork) -> None:
        """The next step's drafts were just proposed (a virtual clock advances by their predicted time)."""


class WallClock:
    kind = "wall"

    def now(self) -> float:
        return time.perf_counter()

    def sleep(self, seconds: float) -> None:
        time.sleep(min(max(seconds, 0.0), 0.5))  # short naps: a caller may have more to do

    def end_step(self, work: StepWork) -> None:
        pass

    def end_draft(self, draft: DraftWork) -> None:
        pass


class ModelledClock:
    """Virtual time advanced by ``time_model.predict`` for each step."""

    kind = "virtual"

    def __init__(self, time_model: TimeModel, per_sampled_s: float = 0.0) -> None:
        """``per_sampled_s``: seconds each sampled token adds to its step (a front end in the
        engine's process, ``frontend.in_engine_process``: :mod:`servelab.engine.frontend`)."""
        if time_model.measured:
            raise ValueError(f"clock=virtual needs a time model that predicts; time_model={time_model.name!r} "
                             "only measures (use time_model=roofline or time_model=profile)")
        self.time_model = time_model
        self.t = 0.0
        self.per_sampled_s = per_sampled_s
        if per_sampled_s:
            self.end_step = self._end_step_with_token_work  # type: ignore[method-assign]  # the default path unchanged

    def now(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        if seconds > 0:
            self.t += seconds

    def end_step(self, work: StepWork) -> None:
        self.t += self.time_model.predict(work)

    def _end_step_with_token_work(self, work: StepWork) -> None:
        self.t += self.time_model.predict(work) + self.per_sampled_s * work.num_sampled

    def end_draft(self, draft: DraftWork) -> None:
        self.t += self.time_model.predict_draft(draft)
