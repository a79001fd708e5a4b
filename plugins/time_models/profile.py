"""``time_model=profile``: a step-time model fitted on this machine by ``servelab profile``."""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from typing import Optional

from servelab.plugin_api import ConfigError, TimeModel, TimeModelContext
from servelab.time_model_api import StepProfile

log = logging.getLogger(__name__)


@dataclass
class ProfileConfig:
    path: Optional[str] = None  # a profile.json written by `servelab profile`


class ProfileTime(TimeModel):
    """Predicts with the piecewise-linear fit stored in ``time_model.path``."""

    name = "profile"
    Config = ProfileConfig

    def __init__(self, config: ProfileConfig, context: TimeModelContext) -> None:
        super().__init__(config, context)
        if not config.path:
            raise ConfigError("time_model=profile needs time_model.path=<profile.json>; make one on this machine "
                              "with `servelab profile [overrides]` (it runs a probe workload on the real engine)")
        self.profile = StepProfile.load(config.path)
        src = self.profile.source
        mine = {"model": context.model_name, "dtype": context.dtype,
                "tensor_parallel_size": context.tensor_parallel_size, "block_size": context.block_size}
        differ = [f"{k}: profile {src.get(k)!r} vs run {v!r}" for k, v in mine.items()
                  if k in src and v and src.get(k) != v]
        shape = asdict(context.shape)
        if "shape" in src and src["shape"] != shape:
            changed = {k: (src["shape"].get(k), v) for k, v in shape.items() if src["shape"].get(k) != v}
            differ.append("model shape: " + ", ".join(f"{k} {a} vs {b}" for k, (a, b) in changed.items()))
        if differ:
            log.warning("time_model=profile: %s was measured for another setup (%s); its times may not apply",
                        config.path, "; ".join(differ))

    @property
    def hardware_label(self) -> str:
        """The machine the profile measured (what ``summary.json`` states as the hardware)."""
        m = self.profile.source.get("machine", {})
        return f"profiled: {m.get('processor', 'unknown CPU')}, {m.get('cores', '?')} cores ({m.get('hostname', '?')})"

    def predict(self, work) -> float:
        return self.profile.predict(work)

    def swap_bytes_per_s(self) -> float | None:
        """The copy bandwidth measured with the profile, else what its swap price implies."""
        measured = self.profile.source.get("swap_bytes_per_s")
        if measured:
            return float(measured)
        per_block = self.profile.coefficients[self.profile.feature_index("swap_blocks")]
        return self.context.bytes_per_block / per_block if per_block > 0 else None

    def describe(self) -> dict:
        return {"name": self.name, "path": self.config.path, "source": self.profile.source, "fit": self.profile.fit}
