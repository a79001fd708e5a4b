"""``time_model=calibrated_roofline``: the roofline's FLOP/byte physics plus what measured GPU
operators show it lacks - a per-kernel floor, a GEMM efficiency that falls for few tokens and narrow
per-rank shards, measured all-reduce latency floors (the hardware catalogue's ``link_latency_us``)
and a host-side term per step and per sequence.

The coefficients come from ``servelab/data/op_tables/calibrated_roofline.json``, fitted by
``experiments/op_tables/fit_roofline.py`` to one GPU's measured operator tables and checked on
another GPU's (held-out hardware): that error is its honest error on hardware without tables
(H200, L40S). The formulas: :mod:`servelab.sim.gpu_ops`; the step: :mod:`servelab.sim.step_pricer`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from servelab.plugin_api import TimeModelContext
from servelab.time_model_api import CALIBRATION_FILE, Calibration, GpuOps, StepPricer

from .priced import PricedTime


@dataclass
class CalibratedRooflineConfig:
    path: Optional[str] = None  # a calibrated_roofline.json; default: the one shipped with the op tables
    host: bool = True  # price the host side of a step (scheduling, input preparation, sampling, outputs)
    activation_dtype_bytes: float = 2.0


class CalibratedRooflineTime(PricedTime):
    name = "calibrated_roofline"
    Config = CalibratedRooflineConfig

    def __init__(self, config: CalibratedRooflineConfig, context: TimeModelContext) -> None:
        super().__init__(config, context)
        self.calibration = Calibration.load(config.path or CALIBRATION_FILE)
        ops = GpuOps(context.hardware, self.calibration)
        s, tp, act = context.shape, context.tensor_parallel_size, config.activation_dtype_bytes
        weight = context.linear_weight_bytes or context.weight_dtype_bytes
        pricer = StepPricer(
            context, ops, act_bytes=act,
            layer=lambda m: ops.layer(m, s, tp, act, weight),
            allreduce=lambda b: ops.allreduce(b, tp),
            host=ops.host if config.host else (lambda m: 0.0 * m))
        self.use(pricer, pricer.draft_pricer(context))

    def describe(self) -> dict:
        hw = self.context.hardware
        return {"name": self.name, "hardware": hw.name, "link_latency_us": hw.link_latency_us,
                "coefficients": self.calibration.coefficients(),
                "fitted_on": self.calibration.source.get("fitted_on"),
                "calibration_file": str(self.config.path or "servelab/data/op_tables/calibrated_roofline.json"),
                "host": self.config.host, "weight_bytes_per_rank": self.context.weight_bytes_per_rank,
                **({"pricing_rule": hw.pricing_rule} if hw.pricing_rule else {})}
