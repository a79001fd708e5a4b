"""The step time KV loads from the tiers below the GPU add, on the virtual clock.

``kv_tiers.load`` states the model:

- ``serialize``: the step waits for its loads, then computes: it takes ``load + compute``;
- ``overlap``: layer ``i``'s KV is copied while layer ``i - 1`` computes (vLLM's layer-wise
  connector, LMCache's and HiCache's layer-wise loading), so the step takes ``max(load, compute)``:
  the load adds only what compute cannot hide.

Either way the added seconds and the hidden ones are told to the store (``summary.json``:
``kv_tier_load_added_s``, ``kv_tier_load_hidden_s``). A step without loads is priced as before.
"""

from __future__ import annotations

from servelab.core.step_work import DraftWork, StepWork
from servelab.kv.tiers.store import TieredKVConnector

LOAD_MODES = ("overlap", "serialize")


class TierLoadClock:
    """A clock (:class:`servelab.engine.clock.Clock`) that adds each step's tier loads to it."""

    def __init__(self, inner, store: TieredKVConnector, load: str) -> None:
        if load not in LOAD_MODES:
            raise ValueError(f"kv_tiers.load={load!r}: one of {LOAD_MODES}")
        self.inner = inner
        self.kind = getattr(inner, "kind", None)
        self.store = store
        self.overlap = load == "overlap"

    def now(self) -> float:
        return self.inner.now()

    def sleep(self, seconds: float) -> None:
        self.inner.sleep(seconds)

    def end_draft(self, draft: DraftWork) -> None:
        self.inner.end_draft(draft)

    def end_step(self, work: StepWork) -> None:
        load_s = self.store.take_load_s()
        if not load_s:
            self.inner.end_step(work)
            return
        start = self.inner.now()
        self.inner.end_step(work)
        compute_s = self.inner.now() - start
        added = max(0.0, load_s - compute_s) if self.overlap else load_s
        self.inner.sleep(added)
        self.store.record_load_time(added, load_s - added)
