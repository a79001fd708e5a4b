"""The plugin contract: everything a plugin module imports, ``from servelab.plugin_api import ...``.

The names here are the public, stable surface (the modules behind them may move). Only the
contract: no test doubles, no runners (those are :mod:`servelab.testing`'s, for a plugin's tests).
Eager and light: importing it loads no torch, Hydra or OmegaConf (``tests/test_plugin_api.py``).

- registration: :data:`hookimpl` (the hooks are in :mod:`servelab.core.hookspecs`); the kinds
  table (:data:`KINDS` of :class:`KindSpec`, :func:`register_kind` to add one);
- the plugin kinds, each built as ``Plugin(config, context)`` with its frozen context:
  :class:`Scheduler` (most subclass :class:`QueueScheduler` and its :class:`WaitQueue`) /
  :class:`SchedulerContext`, :class:`BlockAllocator` / :class:`AllocatorContext`,
  :class:`PreemptionPolicy` / :class:`PreemptionContext`, :class:`SpeculativeDrafter` /
  :class:`DrafterContext`, :class:`TimeModel` / :class:`TimeModelContext`, :class:`LengthPredictor` /
  :class:`PredictorContext`, :class:`Evictor` / :class:`EvictorContext` (with the
  :class:`CachedBlock` events it receives), :class:`Router` / :class:`RouterContext` (with the
  :class:`ReplicaView` s it places among), :class:`Executor` / :class:`ExecutorContext`; the
  :class:`KVConnector` by which KV enters or leaves an engine and the ``kv_connector`` kind's
  :class:`KVConnectorPlugin` / :class:`KVConnectorContext` (with the :class:`KVClusterLink` of a
  cluster's replica); :class:`KVTierPolicy` /
  :class:`KVTierPolicyContext` (with the :class:`TierSpec` s and :class:`TierBlock` s it decides on, and the
  :class:`TierView` it reads the tiers' occupancy and the GPU's reuse counts from);
  :class:`MigrationPolicy` / :class:`MigrationPolicyContext` (with the :class:`ReplicaLoad` s and
  :class:`RequestLoad` s it reads and the :class:`Migrate` decisions it returns);
  :class:`Autoscaler` / :class:`AutoscalerContext` (with the :class:`AutoscaleView` it reads and the
  :class:`ScaleUp` / :class:`ScaleDown` decisions it returns);
- the data they exchange: :class:`Request`, :class:`SamplingParams`, :class:`Sequence`,
  :class:`Status`, :class:`SchedulePlan`, :class:`ScheduledSeq`, :class:`PreemptionDecision`,
  :class:`Drafts`, :class:`EngineLimits`, :class:`NextDecision` (with :data:`EVERY_STEP`,
  :data:`UNTIL_ARRIVAL`: a scheduler's answer to the simulator's fast-forward), :class:`StepWork`, :class:`DraftWork`, :class:`StepBatch`,
  :class:`StepOutput`, :class:`NoConfig`;
  the policies' cost model (:class:`StepCostModel`, :class:`StepFeatures`); a time model's shapes
  (:class:`ModelShape`, :class:`HardwareProfile`, :data:`INT8_SCALE_BYTES`); a model-running
  drafter's :class:`DraftBatch` (:func:`build_draft_batch`, :data:`MAX_DRAFT_TOKENS`); the shipped
  checkpoints' folder (:data:`PACKAGED_CHECKPOINTS`);
- errors: :class:`ConfigError`, :class:`EvictorError`, :class:`RouterError`.

A time model that prices a step from operator tables or the calibrated roofline also imports
:mod:`servelab.time_model_api` (the simulator's pricing blocks, still torch-free).

Moved out: ``FakeExecutor``, ``KVCheckingExecutor``, ``VirtualClock``, ``StepTimeModel``,
``check_plugin``, ``Report``, ``compose`` and ``run_job`` are :mod:`servelab.testing`'s. Asking for
one here says so: ``from servelab.plugin_api import FakeExecutor`` raises an :class:`ImportError`,
``servelab.plugin_api.FakeExecutor`` an :class:`AttributeError` (so ``hasattr`` is False). No import
happens here: this module never loads the testing layer.
"""

from __future__ import annotations

import opcode
import sys
from typing import NoReturn

from servelab.core.batch import StepBatch
from servelab.core.contexts import (AllocatorContext, DrafterContext, EvictorContext, ExecutorContext,
                                    KVClusterLink, KVConnectorContext, KVTierPolicyContext, MigrationPolicyContext, PredictorContext, PreemptionContext, RouterContext, SchedulerContext,
                                    TimeModelContext)
from servelab.core.cost_model import StepCostModel, StepFeatures
from servelab.core.errors import ConfigError
from servelab.core.executor import Executor, StepOutput
from servelab.core.expert_placement import ExpertPlacement, ExpertPlacementContext, linear_plan
from servelab.core.expert_cache import ExpertCache, ExpertCacheContext, check_mask, top_slots
from servelab.core.hookspecs import hookimpl
from servelab.core.interfaces import (BlockAllocator, BlockEventSubscriber, CachedBlock, Drafts, EngineLimits, Evictor, EvictorError,
                                      EVERY_STEP, UNTIL_ARRIVAL, LengthPredictor, NextDecision, NoConfig, Plugin,
                                      PreemptionDecision, PreemptionPolicy, ReplicaView, Router, RouterError,
                                      ScheduledSeq, SchedulePlan, Scheduler, SpeculativeDrafter, TimeModel)
from servelab.core.kinds import KINDS, KindSpec, register_kind
from servelab.core.block_hash import block_digest, block_hashes, root_digest
from servelab.core.kv_connector import NO_TRANSFER, KVConnector, KVTransferTime
from servelab.core.kv_connector_plugin import KVConnectorPlugin
from servelab.core.kv_tiers import KVTierPolicy, TierBlock, TierSpec
from servelab.core.migration_policy import Migrate, MigrationPolicy, ReplicaLoad, RequestLoad
from servelab.core.autoscaler import Autoscaler, AutoscalerContext, AutoscaleView, ScaleDown, ScaleUp
from servelab.core.tier_view import TierView
from servelab.core.packaged import PACKAGED_CHECKPOINTS
from servelab.core.request import Request, SamplingParams, Sequence, Status
from servelab.core.shapes import INT8_SCALE_BYTES, HardwareProfile, ModelShape
from servelab.core.step_work import DraftWork, StepWork
from servelab.engine.drafting import MAX_DRAFT_TOKENS, DraftBatch, build_draft_batch
from servelab.engine.scheduling import QueueScheduler, WaitQueue

__all__ = [
    "hookimpl", "KindSpec", "KINDS", "register_kind",
    # the kinds and their contexts
    "Plugin", "Scheduler", "QueueScheduler", "WaitQueue", "SchedulerContext", "BlockAllocator", "AllocatorContext",
    "PreemptionPolicy", "PreemptionContext", "SpeculativeDrafter", "DrafterContext", "TimeModel",
    "TimeModelContext", "LengthPredictor", "PredictorContext", "Evictor", "EvictorContext", "CachedBlock",
    "Router", "RouterContext", "ReplicaView", "Executor", "ExecutorContext", "KVConnector",
    "KVTransferTime", "NO_TRANSFER", "BlockEventSubscriber", "block_digest", "block_hashes", "root_digest",
    "KVConnectorPlugin", "KVConnectorContext", "KVClusterLink",
    "KVTierPolicy", "KVTierPolicyContext", "TierSpec", "TierBlock", "TierView",
    "ExpertPlacement", "ExpertPlacementContext", "linear_plan",
    "ExpertCache", "ExpertCacheContext", "check_mask", "top_slots",
    "MigrationPolicy", "MigrationPolicyContext", "ReplicaLoad", "RequestLoad", "Migrate",
    "Autoscaler", "AutoscalerContext", "AutoscaleView", "ScaleUp", "ScaleDown",
    # the data they exchange
    "Request", "SamplingParams", "Sequence", "Status", "SchedulePlan", "ScheduledSeq", "PreemptionDecision",
    "Drafts", "EngineLimits", "NextDecision", "EVERY_STEP", "UNTIL_ARRIVAL", "StepWork", "DraftWork", "StepBatch", "StepOutput", "NoConfig", "StepCostModel",
    "StepFeatures", "ModelShape", "HardwareProfile", "INT8_SCALE_BYTES", "DraftBatch", "build_draft_batch",
    "MAX_DRAFT_TOKENS", "PACKAGED_CHECKPOINTS",
    # errors
    "ConfigError", "EvictorError", "RouterError",
]

#: Names this module handed out (lazily) before it became the contract only; :mod:`servelab.testing` has them.
MOVED_TO_TESTING = ("FakeExecutor", "KVCheckingExecutor", "VirtualClock", "StepTimeModel", "check_plugin", "Report",
                    "compose", "run_job")


def __getattr__(name: str) -> NoReturn:
    """An :class:`AttributeError` for any unknown name, as a module's attribute lookup must give
    (``hasattr``, ``getattr(m, name, default)``); for the 0.1 testing names it says where they went
    (nothing is loaded or forwarded). Asked by a ``from servelab.plugin_api import FakeExecutor`` it is
    an :class:`ImportError` with the same words: Python turns an AttributeError there into its generic
    "cannot import name", which would lose them."""
    if name not in MOVED_TO_TESTING:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}", name=name, obj=sys.modules[__name__])
    message = (f"servelab.plugin_api.{name} moved to servelab.testing (plugin_api is the plugin contract only): "
               f"`from servelab.testing import {name}`")
    caller = sys._getframe(1)
    if opcode.opname[caller.f_code.co_code[caller.f_lasti]] == "IMPORT_FROM":
        raise ImportError(message, name=name, path=__file__)
    raise AttributeError(message, name=name, obj=sys.modules[__name__])
