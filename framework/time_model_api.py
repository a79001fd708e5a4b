"""The simulator's pricing blocks a time-model plugin builds on: ``from servelab.time_model_api import ...``.

A sub-facade of :mod:`servelab.plugin_api` for one kind. A time model is the ground truth of a
virtual world (``docs/write-a-time-model.md``); the simplest ones need only the contract
(:class:`~servelab.plugin_api.TimeModel`, :class:`~servelab.plugin_api.TimeModelContext`,
:class:`~servelab.plugin_api.StepWork`). Those that price a step operator by operator reuse the
simulator's blocks, named here so the modules behind them may move:

- :class:`StepPricer` / :class:`DraftPricer`: a step's (and a drafting pass's) seconds from per-op
  prices (:mod:`servelab.sim.step_pricer`);
- :class:`GpuOps`, :class:`Calibration`, :data:`CALIBRATION_FILE`: the calibrated roofline's
  operator formulas and its fitted constants (:mod:`servelab.sim.gpu_ops`);
- :func:`load_op_tables`, :func:`find_op_tables`, :func:`describe_available`, :class:`OpTables`:
  measured operator tables (:mod:`servelab.sim.op_tables`, ``docs/op-tables.md``);
- :class:`StepProfile`: a fitted piecewise-linear step profile (:mod:`servelab.sim.step_profile`);
- :func:`measured_on`, :func:`spec_sheet`, :func:`hbm_rescaled`: hardware without tables priced by
  another's tables and its own HBM (``hardware.tables_from``, :mod:`servelab.sim.hardware_rule`);
- :class:`MoePricer`, :class:`AllToAll`, :class:`ExpertRouting`, :func:`routing_for`: a MoE step's
  experts from those its tokens touch, expert parallelism's all-to-all (:mod:`servelab.sim.moe_pricer`).

Torch-free, like :mod:`servelab.plugin_api` (numpy only). It sits in the layer above ``sim``; the
import contract ``plugins-use-the-plugin-api`` lets built-in plugins import it beside
``plugin_api`` and ``testing``.
"""

from __future__ import annotations

from servelab.sim.gpu_ops import CALIBRATION_FILE, Calibration, GpuOps
from servelab.sim.hardware_rule import hbm_rescaled, measured_on, spec_sheet
from servelab.sim.moe_pricer import AllToAll, MoePricer, routing_for
from servelab.sim.moe_routing import ExpertRouting
from servelab.sim.op_tables import OpTables, describe_available, find_op_tables, load_op_tables
from servelab.sim.step_pricer import DraftPricer, StepPricer
from servelab.sim.step_profile import StepProfile

__all__ = ["StepPricer", "DraftPricer", "GpuOps", "Calibration", "CALIBRATION_FILE", "OpTables", "load_op_tables",
           "find_op_tables", "describe_available", "StepProfile", "measured_on", "spec_sheet", "hbm_rescaled",
           "MoePricer", "AllToAll", "ExpertRouting", "routing_for"]
