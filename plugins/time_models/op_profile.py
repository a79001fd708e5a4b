"""``time_model=op_profile``: each step priced from **measured per-operator GPU tables**
(``servelab/data/op_tables``; format and sources: docs/op-tables.md).

Per step on one rank: the decoder layers' linears and token-wise kernels from the tables' per-layer
curve over the step's tokens; the all-reduces from the hardware's measured NCCL table over the
message bytes; the host side of a step from the host table where one was measured (else the
calibrated roofline's host term); and what no public table measures - attention, the LM head, swap
and copy traffic - from the calibrated roofline (:mod:`servelab.sim.gpu_ops`). ``describe()`` (in
``summary.json``) names the tables and which model priced each part.

Interpolation is log-log between measured points; beyond the last point times grow in proportion,
with one warning naming the table and its measured range.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from servelab.plugin_api import ConfigError, TimeModelContext
from servelab.time_model_api import (CALIBRATION_FILE, Calibration, GpuOps, StepPricer, describe_available,
                                     find_op_tables, hbm_rescaled, load_op_tables, measured_on, spec_sheet)

from .priced import PricedTime


@dataclass
class OpProfileConfig:
    path: Optional[str] = None  # a table folder (with manifest.json); default: find one for hardware/model/TP/dtype
    host: bool = True  # price the host side of a step
    activation_dtype_bytes: float = 2.0


def op_tables_for(context: TimeModelContext, path: str | None = None):
    """The tables for this context (or ``path``), or None when the package has none for it."""
    if path:
        return load_op_tables(path, shape=context.shape, tp=context.tensor_parallel_size, dtype=context.dtype)
    own = find_op_tables(context.hardware.name, context.shape, context.tensor_parallel_size, context.dtype)
    if own is not None or not context.hardware.tables_from:
        return own
    # no tables of its own: hardware.tables_from's (H200: H100's tables at its own HBM, servelab.sim.hardware_rule)
    return find_op_tables(measured_on(context.hardware), context.shape, context.tensor_parallel_size, context.dtype)


def _tables_unusable(context: TimeModelContext) -> str | None:
    if context.linear_weight_bytes is not None:
        return "model.quantization=int8 (the tables time float16 GEMMs)"
    return None


class OpProfileTime(PricedTime):
    name = "op_profile"
    Config = OpProfileConfig

    def __init__(self, config: OpProfileConfig, context: TimeModelContext) -> None:
        super().__init__(config, context)
        s, tp, act = context.shape, context.tensor_parallel_size, config.activation_dtype_bytes
        why_not = _tables_unusable(context)
        if why_not:
            raise ConfigError(f"time_model=op_profile cannot price {why_not}; use time_model=auto or "
                              "time_model=calibrated_roofline")
        tables = op_tables_for(context, config.path)
        if tables is None:
            raise ConfigError(
                f"time_model=op_profile: no op tables for hardware={context.hardware.name}, this model's shape "
                f"(hidden {s.hidden_size}, ffn {s.intermediate_size}, heads {s.num_heads}/{s.num_kv_heads}), "
                f"tensor_parallel_size={tp}, dtype={context.dtype}; tables exist for: {describe_available()}; "
                "use time_model=auto (op tables where they exist, else the calibrated roofline) or "
                "time_model=calibrated_roofline")
        self.tables = tables
        self.calibration = Calibration.load(CALIBRATION_FILE)
        ops = GpuOps(context.hardware, self.calibration)
        layer = tables.layer_curve(tp).at
        self.borrowed = None if config.path or tables.hardware == context.hardware.name else tables.hardware
        if self.borrowed:  # the measured layers at this sheet's HBM bandwidth (the stated rule)
            layer = hbm_rescaled(layer, s, tp, context.hardware, spec_sheet(self.borrowed), self.calibration, act,
                                 context.weight_dtype_bytes)
        allreduce = tables.allreduce_curve(tp)
        host = tables.host_curve(tp) if config.host else None
        self.sources = {"layers": f"op tables of {self.borrowed}, HBM rescaled to {context.hardware.name}"
                        if self.borrowed else "op tables", "attention": "calibrated roofline",
                        "lm_head": "calibrated roofline",
                        "communication": "op tables (all_reduce)" if allreduce is not None or tp == 1
                        else "calibrated roofline (no all-reduce table for this TP)",
                        "host": ("op tables (host)" if host is not None else "calibrated roofline") if config.host
                        else "not priced"}
        host_fn = (host.at if host is not None else ops.host) if config.host else (lambda m: 0.0 * m)
        pricer = StepPricer(
            context, ops, act_bytes=act, layer=layer,
            allreduce=allreduce.at if allreduce is not None else (lambda b: ops.allreduce(b, tp)),
            host=host_fn)
        draft_tables = (find_op_tables(context.hardware.name, context.draft_shape, 1, context.dtype)
                        if context.draft_shape is not None else None)
        self.use(pricer, pricer.draft_pricer(
            context, layer=draft_tables.layer_curve(1).at if draft_tables is not None else None))

    def describe(self) -> dict:
        hw = self.context.hardware
        return {"name": self.name, "hardware": hw.name, "tables": self.tables.describe(),
                "priced_by": self.sources, "calibration": self.calibration.coefficients(),
                "weight_bytes_per_rank": self.context.weight_bytes_per_rank,
                **({"pricing_rule": hw.pricing_rule} if hw.pricing_rule else {})}
