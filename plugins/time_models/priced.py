"""The base of the time models that price a step through :class:`servelab.sim.step_pricer.StepPricer`
(``op_profile``, ``calibrated_roofline``): what they share once each has built its pricers."""

from __future__ import annotations

from servelab.plugin_api import TimeModel
from servelab.time_model_api import DraftPricer, StepPricer


class PricedTime(TimeModel):
    """A time model whose steps and drafts are priced by a :class:`StepPricer` / :class:`DraftPricer`."""

    pricer: StepPricer
    draft_pricer: DraftPricer

    def use(self, pricer: StepPricer, draft_pricer: DraftPricer) -> None:
        self.pricer, self.draft_pricer = pricer, draft_pricer
        self.predict = pricer.predict  # type: ignore[method-assign]  # the hot path: no extra call per step

    def predict(self, work) -> float:  # replaced per instance by the pricer's (see use())
        return self.pricer.predict(work)

    def predict_draft(self, draft) -> float:
        return self.draft_pricer.predict(draft)

    def breakdown(self, work) -> dict[str, float]:
        """Seconds per component of the step (layers, attention, communication, lm_head, host, swap, copy)."""
        return self.pricer.breakdown(work)

    def timing_summary(self) -> dict:
        """The engine timing features' figures (``sim.cuda_graphs``, ``sim.all_reduce``) for ``summary.json``."""
        return self.pricer.timing_summary()

    @property
    def moe_label(self) -> str | None:
        """How a MoE model's experts are priced (the banner's MoE row); None for a dense model."""
        return self.pricer.moe.label() if self.pricer.moe is not None else None

    @property
    def pipeline_label(self) -> str | None:
        """The stages, batches in flight and the link between stages (the banner's pipeline row); None at PP 1."""
        return self.pricer.pipeline.layout.describe() if self.pricer.pipeline is not None else None

    def swap_bytes_per_s(self) -> float:
        return self.context.hardware.host_link_gb_s * 1e9
