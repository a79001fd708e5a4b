"""Hardware without measured tables, priced by a stated rule (docs/op-tables.md "Hardware without tables").

A ``conf/hardware`` sheet may name ``tables_from``: the hardware whose measured operator tables price
it. The rule, for H200 (``tables_from: h100``): H100's measured decoder-layer tables, NCCL table and
custom all-reduce figures (the same NVLink 4 / NVSwitch baseboard and the same tensor cores: 989
dense BF16 TFLOP/s on both sheets), with H200's own HBM bandwidth and capacity. The bandwidth enters
through the calibrated roofline: each measured layer time is multiplied by the roofline's ratio of
the two sheets' prices at that token count, ``layer_own(m) / layer_measured_on(m)`` (below 1 where
the layer reads weights at HBM speed, 1 where it is compute-bound, since the peaks are equal).
Attention, the LM head and swap traffic are priced from the run's own sheet anyway.

A sheet without tables and without ``tables_from`` (B200) is priced by the calibrated roofline from
its spec sheet alone; its ``pricing_rule`` says so ("roofline only, not validated").
"""

from __future__ import annotations

import functools
from importlib import resources
from pathlib import Path
from typing import Callable

import numpy as np
import yaml

from servelab.core.errors import ConfigError
from servelab.core.shapes import HardwareProfile, ModelShape
from servelab.sim.gpu_ops import Calibration, GpuOps

ArrayFn = Callable[[np.ndarray], np.ndarray]


@functools.lru_cache(maxsize=16)
def spec_sheet(name: str, folder: str | None = None) -> HardwareProfile:
    """The ``conf/hardware/<name>.yaml`` sheet as a :class:`HardwareProfile` (the hardware a
    ``tables_from`` names); a missing sheet is a :class:`ConfigError` naming the file."""
    path = Path(folder) / f"{name}.yaml" if folder else resources.files("servelab.conf") / "hardware" / f"{name}.yaml"
    try:
        node = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ConfigError(f"hardware.tables_from={name}: no sheet {path} ({exc.strerror})") from None
    return HardwareProfile.from_config(node)


def measured_on(hardware: HardwareProfile) -> str:
    """The hardware whose tables price ``hardware``: its ``tables_from``, else itself."""
    return hardware.tables_from or hardware.name


def hbm_rescaled(layer: ArrayFn, shape: ModelShape, tp: int, own: HardwareProfile, table_hw: HardwareProfile,
                 cal: Calibration, act_bytes: float, weight_bytes: float) -> ArrayFn:
    """``layer`` (seconds of one decoder layer measured on ``table_hw``, by tokens) as ``own`` would
    take it: times the calibrated roofline's ratio ``own / table_hw`` at each token count."""
    mine, theirs = GpuOps(own, cal), GpuOps(table_hw, cal)

    def rescaled(m: np.ndarray) -> np.ndarray:
        m = np.asarray(m, dtype=float)
        a = mine.layer(m, shape, tp, act_bytes, weight_bytes)
        b = theirs.layer(m, shape, tp, act_bytes, weight_bytes)
        ratio = np.divide(a, b, out=np.ones_like(a), where=b > 0)
        return layer(m) * ratio

    return rescaled
