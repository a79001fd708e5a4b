"""Everything a plugin author imports, in one place: ``from servelab.plugin_api import ...``.

The names here are the public, stable surface (the modules behind them may move):

- registration: :data:`hookimpl` (the hooks are in :mod:`servelab.core.hookspecs`);
- the eight plugin kinds: :class:`Scheduler` (most subclass :class:`QueueScheduler`),
  :class:`BlockAllocator`, :class:`PreemptionPolicy`, :class:`SpeculativeDrafter`,
  :class:`TimeModel` (with its :class:`TimeModelContext`), :class:`LengthPredictor` (with its
  :class:`PredictorContext`), :class:`Evictor` (with its :class:`EvictorContext` and the
  :class:`CachedBlock` events it receives; :class:`StepCostModel` prices recomputing a block),
  :class:`Router` (with its :class:`RouterContext`, the :class:`ReplicaView` s it places among, and
  the :class:`RouterError` a bad placement stops a run with);
- the data they exchange: :class:`Request`, :class:`SamplingParams`, :class:`Sequence`,
  :class:`Status`, :class:`SchedulePlan`, :class:`ScheduledSeq`, :class:`PreemptionDecision`,
  :class:`Drafts`, :class:`EngineLimits`, :class:`StepWork`, :class:`NoConfig`, :class:`ConfigError`;
- testing: the doubles :class:`FakeExecutor`, :class:`KVCheckingExecutor`, :class:`VirtualClock`
  and the conformance kit's :func:`check_plugin` / :class:`Report`; :func:`compose` and
  :func:`run_job` to run a whole stack in a test (all loaded on first use: they bring torch and
  Hydra, which a plugin module itself need not import).
"""

from __future__ import annotations

from servelab.core.cost_model import StepCostModel
from servelab.core.errors import ConfigError
from servelab.core.hookspecs import hookimpl
from servelab.core.interfaces import (BlockAllocator, CachedBlock, Drafts, EngineLimits, Evictor, EvictorContext,
                                      LengthPredictor, NoConfig,
                                      PredictorContext, PreemptionDecision, PreemptionPolicy, ReplicaView, Router,
                                      RouterContext, RouterError, ScheduledSeq,
                                      SchedulePlan, Scheduler, SpeculativeDrafter, TimeModel, TimeModelContext)
from servelab.core.request import Request, SamplingParams, Sequence, Status
from servelab.core.step_work import StepWork
from servelab.engine.scheduling import QueueScheduler, WaitQueue

_TESTING = ("FakeExecutor", "KVCheckingExecutor", "VirtualClock", "StepTimeModel")
_CONFORMANCE = ("check_plugin", "Report")
_RUNNING = ("compose", "run_job")

__all__ = ["hookimpl", "Scheduler", "QueueScheduler", "WaitQueue", "BlockAllocator", "PreemptionPolicy",
           "SpeculativeDrafter", "TimeModel", "TimeModelContext", "LengthPredictor", "PredictorContext", "Evictor", "EvictorContext", "CachedBlock", "StepCostModel",
           "Router", "RouterContext", "ReplicaView", "RouterError",
           "Request", "SamplingParams", "Sequence", "Status",
           "SchedulePlan", "ScheduledSeq", "PreemptionDecision", "Drafts", "EngineLimits", "StepWork", "NoConfig",
           "ConfigError", *_TESTING, *_CONFORMANCE, *_RUNNING]


def __getattr__(name: str):
    if name in _TESTING:
        from servelab.kit import testing  # noqa: PLC0415 - torch

        return getattr(testing, name)
    if name in _CONFORMANCE:
        from servelab.kit import conformance  # noqa: PLC0415 - torch, Hydra

        return getattr(conformance, name)
    if name == "compose":
        from servelab.api import compose  # noqa: PLC0415 - Hydra

        return compose
    if name == "run_job":
        from servelab.run.session import run_job  # noqa: PLC0415 - torch, Hydra

        return run_job
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
