"""A run's picture over time, kept for every run at a few numbers a step: :class:`StepTimeline`.

Each step adds one row (when it ended, how long it took, sequences in it, sequences held but not in it,
tokens computed, of which prompt, the KV pool's used share, preemptions so far), in typed columns
(``array``). The rows are bounded: once :data:`MAX_ROWS` are held, every other one is dropped and from
then on only every other step is kept (then every 4th, ...), so a long run holds at most ``MAX_ROWS``
rows spread evenly over it; a skipped step costs the engine one decrement, a kept one a few appends.
Preemptions are a running count, so thinning loses none.
The columns are written beside ``summary.json`` as ``timeline.npz`` (:mod:`servelab.results.writer`)
and drawn by ``servelab report`` (:mod:`servelab.results.page`).
"""

from __future__ import annotations

from array import array
from typing import Any

#: rows held at most per engine (a figure is about 1,000 pixels wide; 16,384 rows keep its detail)
FILE = "timeline.npz"  # beside summary.json: written by servelab.results.writer, read by servelab.results.page
MAX_ROWS = 16_384
#: the columns, in the order of :meth:`StepTimeline.add`'s arguments (times: float64; counts: int64; KV: float32)
COLUMNS = ("time_s", "duration_s", "running", "waiting", "tokens", "prefill_tokens", "kv_used", "preemptions")


class StepTimeline:
    """The rows of one engine's steps, thinned evenly once there are :data:`MAX_ROWS` of them.

    The engine counts down :attr:`due` at each step and calls :meth:`add` when it reaches 0 (a skipped
    step costs one decrement); :meth:`preempted` counts every step's preemptions, kept or not."""

    def __init__(self, max_rows: int = MAX_ROWS) -> None:
        self.max_rows = max_rows
        self.stride = 1  # keep every stride-th step
        self.due = 1  # steps until the next kept one (the engine counts it down)
        self.num_preemptions = 0
        self.time_s: array[float] = array("d")
        self.duration_s: array[float] = array("d")
        self.running: array[int] = array("q")
        self.waiting: array[int] = array("q")
        self.tokens: array[int] = array("q")
        self.prefill_tokens: array[int] = array("q")
        self.kv_used: array[float] = array("f")
        self.preemptions: array[int] = array("q")

    def preempted(self, count: int) -> None:
        """A step preempted ``count`` sequences (called for every step that preempted, kept or not)."""
        self.num_preemptions += count

    def add(self, time_s: float, duration_s: float, running: int, waiting: int, tokens: int, prefill_tokens: int,
            kv_used: float) -> None:
        """The step now due: it ended at ``time_s`` (the engine's seconds) after ``duration_s``, ran
        ``running`` sequences while ``waiting`` others were held, computed ``tokens`` (``prefill_tokens``
        of prompts) and left the pool ``kv_used`` full."""
        self.due = self.stride
        self.time_s.append(time_s)
        self.duration_s.append(duration_s)
        self.running.append(running)
        self.waiting.append(waiting)
        self.tokens.append(tokens)
        self.prefill_tokens.append(prefill_tokens)
        self.kv_used.append(kv_used)
        self.preemptions.append(self.num_preemptions)
        if len(self.time_s) >= self.max_rows:
            self._thin()

    def _thin(self) -> None:
        for name in COLUMNS:
            column = getattr(self, name)
            setattr(self, name, column[1::2])  # the later of each pair: the last step kept stays
        self.stride *= 2
        self.due = self.stride

    def __len__(self) -> int:
        return len(self.time_s)

    def columns(self) -> dict[str, array[Any]]:
        """The columns by name (plain data: an engine process sends them to its parent)."""
        return {name: getattr(self, name) for name in COLUMNS}
