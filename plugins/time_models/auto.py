"""``time_model=auto`` (the simulator's default): ``op_profile`` where measured operator tables
exist for the (hardware, model shape, TP degree, dtype), else ``calibrated_roofline``. The start-up
banner and ``summary.json`` say which was chosen, and from which tables."""

from __future__ import annotations

from dataclasses import dataclass

from servelab.plugin_api import TimeModel, TimeModelContext

from .calibrated_roofline import CalibratedRooflineConfig, CalibratedRooflineTime
from .op_profile import OpProfileConfig, OpProfileTime, _tables_unusable, op_tables_for


@dataclass
class AutoConfig:
    host: bool = True  # price the host side of a step
    activation_dtype_bytes: float = 2.0


class AutoTime(TimeModel):
    name = "auto"
    Config = AutoConfig

    def __init__(self, config: AutoConfig, context: TimeModelContext) -> None:
        super().__init__(config, context)
        why_not = _tables_unusable(context)
        if why_not is None and op_tables_for(context) is None:
            why_not = f"no op tables for hardware={context.hardware.name}, this shape and TP {context.tensor_parallel_size}"
        if why_not is None:
            self.chosen: OpProfileTime | CalibratedRooflineTime = OpProfileTime(OpProfileConfig(host=config.host,
                                                                   activation_dtype_bytes=config.activation_dtype_bytes),
                                                   context)
        else:
            self.chosen = CalibratedRooflineTime(CalibratedRooflineConfig(
                host=config.host, activation_dtype_bytes=config.activation_dtype_bytes), context)
        self.reason = why_not
        self.predict = self.chosen.predict  # type: ignore[method-assign]  # the hot path: the chosen model's own method

    def predict(self, work) -> float:  # replaced per instance (see __init__)
        return self.chosen.predict(work)

    def predict_draft(self, draft) -> float:
        return self.chosen.predict_draft(draft)

    def breakdown(self, work) -> dict[str, float]:
        return self.chosen.breakdown(work)

    def timing_summary(self) -> dict:
        return self.chosen.timing_summary()

    def swap_bytes_per_s(self) -> float | None:
        return self.chosen.swap_bytes_per_s()

    @property
    def moe_label(self) -> str | None:
        return self.chosen.moe_label

    @property
    def pipeline_label(self) -> str | None:
        return self.chosen.pipeline_label

    @property
    def label(self) -> str:
        """``auto -> op_profile (h100/llama2_70b tables, Vidur)`` (or ``..., servelab profile-ops``: who
        measured them) or ``auto -> calibrated_roofline (<why>)``."""
        if isinstance(self.chosen, OpProfileTime):
            t = self.chosen.tables
            source = t.manifest.get("source", {})
            by = source.get("tool") or ("Vidur" if "vidur" in str(source.get("repo", "")) else "measured")
            rule = f"; {self.context.hardware.name} by rule" if getattr(self.chosen, "borrowed", None) else ""
            return f"auto -> op_profile ({t.hardware}/{t.model} tables, {by}{rule})"
        sheet_rule = self.context.hardware.pricing_rule
        return f"auto -> calibrated_roofline ({self.reason}{'; ' + sheet_rule if sheet_rule else ''})"

    def describe(self) -> dict:
        return {**self.chosen.describe(), "name": self.name, "chosen": self.chosen.name,
                "why": self.reason or "op tables exist for this hardware, shape, TP and dtype"}
