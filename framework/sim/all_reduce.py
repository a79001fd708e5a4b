"""Which all-reduce prices a tensor-parallel step (``sim.all_reduce``).

- ``nccl`` (default): the time model's own all-reduce, the hardware's measured NCCL table
  (``op_profile``) or the calibrated roofline's formula.
- ``custom``: every all-reduce as vLLM's custom one-shot / two-shot all-reduce over NVLink, from
  published microbenchmarks (``<hardware>/network/custom_all_reduce.csv``, sources in its
  manifest; docs/op-tables.md). Hardware or a TP degree without published figures is refused.
- ``auto``: what vLLM 0.6 does (vllm/distributed/device_communicators/custom_all_reduce.py):
  the custom kernel for world sizes in ``_SUPPORTED_WORLD_SIZES = [2, 4, 6, 8]`` on a fully
  NVLink-connected node and messages ``inp_size < max_size`` (``max_size=8192 * 1024``), NCCL
  otherwise. Figures were published only for NVLink nodes, so hardware with custom figures is
  taken as NVLink-connected; hardware without them (PCIe L40S) prices NCCL. Hardware priced by
  another's tables (``hardware.tables_from``: H200 by H100's, the same NVLink 4 baseboard) uses that
  hardware's custom figures too (servelab.sim.hardware_rule).
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from servelab.core.contexts import TimeModelContext
from servelab.core.errors import ConfigError
from servelab.sim.op_tables import custom_allreduce_curve, custom_allreduce_degrees

ArrayFn = Callable[[np.ndarray], np.ndarray]

CUSTOM_MAX_BYTES = 8192 * 1024  # vLLM 0.6 CustomAllreduce(max_size=8192 * 1024); custom when inp_size < max_size
CUSTOM_WORLD_SIZES = (2, 4, 6, 8)  # vLLM 0.6 CustomAllreduce._SUPPORTED_WORLD_SIZES
IMPLEMENTATIONS = ("nccl", "custom", "auto")


def choose_all_reduce(context: TimeModelContext, nccl: ArrayFn) -> tuple[ArrayFn, str]:
    """``(seconds of one all-reduce against message bytes, what priced it)`` for ``context.all_reduce``;
    ``nccl`` is the time model's own price. Raises :class:`ConfigError` for ``custom`` without figures."""
    impl, tp = context.all_reduce, context.tensor_parallel_size
    hw = context.hardware.tables_from or context.hardware.name  # H200: H100's figures (the same NVLink 4)
    if impl not in IMPLEMENTATIONS:
        raise ConfigError(f"sim.all_reduce={impl!r}: choose one of {', '.join(IMPLEMENTATIONS)}")
    if impl == "nccl":
        return nccl, "nccl"
    custom = custom_allreduce_curve(hw, tp)
    if impl == "custom":
        if custom is None:
            have = custom_allreduce_degrees(hw)
            raise ConfigError(
                f"sim.all_reduce=custom: no published custom all-reduce figures for hardware={hw} at "
                f"tensor_parallel_size={tp} (figures exist for "
                f"{f'tp {have} on {hw}' if have else 'h100 tp 2/4/8 and a100_80gb tp 2/4'}; docs/op-tables.md); "
                "use sim.all_reduce=nccl or sim.all_reduce=auto")
        return custom.at, "custom"
    if tp not in CUSTOM_WORLD_SIZES or custom is None:
        why = (f"tp {tp} is not one of vLLM's custom all-reduce world sizes {list(CUSTOM_WORLD_SIZES)}"
               if tp not in CUSTOM_WORLD_SIZES else f"no published custom all-reduce figures for {hw} tp {tp}")
        return nccl, f"nccl (auto: {why})"

    def auto(nbytes: np.ndarray) -> np.ndarray:
        nbytes = np.asarray(nbytes, dtype=float)
        out = np.array(nccl(nbytes), dtype=float)
        small = nbytes < CUSTOM_MAX_BYTES  # (the custom curve is not evaluated past its kernel's limit)
        out[small] = custom.at(nbytes[small])
        return out

    return auto, f"auto (custom below {CUSTOM_MAX_BYTES // 2**20} MiB, nccl above)"
