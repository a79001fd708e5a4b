"""The plugin kinds, as data: one :class:`KindSpec` per kind, and the one way a plugin is built.

Every consumer iterates :data:`KINDS` — the registry and its pluggy hook specs, the stack
(:func:`build_order`, :func:`build_context`, :func:`instantiate`), the config schema and its
defaults, ``--help``, ``check-plugin``, ``new-plugin`` and ``grade`` — so a new kind is one
:func:`register_kind` call (or one entry below for a built-in kind) plus its base class, its
context and its contracts. What lives above ``core`` (the conformance stages, the ``new-plugin``
template, the grading workloads) is named here by string and resolved by the layer that runs it.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import logging
import warnings
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from servelab.core.contexts import (LEGACY_CONTEXT, AllocatorContext, DrafterContext, EvictorContext, ExecutorContext,
                                    KVConnectorContext, KVTierPolicyContext, MigrationPolicyContext, PredictorContext, PreemptionContext, RouterContext, SchedulerContext,
                                    TimeModelContext)
from servelab.core.errors import ConfigError
from servelab.core.executor import Executor
from servelab.core.expert_cache import ExpertCache, ExpertCacheContext
from servelab.core.expert_placement import ExpertPlacement, ExpertPlacementContext
from servelab.core.interfaces import (BlockAllocator, Evictor, LengthPredictor, Plugin, PreemptionPolicy, Router,
                                      Scheduler, SpeculativeDrafter, TimeModel)
from servelab.core.kv_connector_plugin import KVConnectorPlugin
from servelab.core.kv_tiers import KVTierPolicy
from servelab.core.migration_policy import MigrationPolicy
from servelab.core.autoscaler import Autoscaler, AutoscalerContext

log = logging.getLogger(__name__)

#: Where a kind's plugin is built: once per engine by the stack, once per run for the executor
#: (first: it sizes the KV pool), or once per cluster (routers, migration policies, autoscalers).
SCOPES = ("executor", "engine", "cluster")


@dataclass(frozen=True)
class KindSpec:
    """One plugin kind.

    ``name`` is the kind (``check-plugin <name>=x``, ``new-plugin <name> x``) and, unless ``group``
    says otherwise, the config group that selects a plugin (``<group>=<plugin>``). ``hook`` is the
    pluggy hook a package implements to return its classes of this kind; every class subclasses
    ``base`` and is built as ``cls(config, context)`` with a ``context`` instance. ``default`` is the
    plugin a run uses when nothing selects one. ``checks`` are the conformance stages
    ``check-plugin`` runs (names of :mod:`servelab.kit.conformance` stages, or ``"module:function"``
    taking ``(report, name, registry, overrides, cases, seed, max_failures)``); empty = the kind has
    no conformance kit. ``template``: the ``new-plugin`` template (a name in
    :mod:`servelab.kit.plugin_templates` or ``"module:attr"`` holding a ``string.Template``); None =
    ``new-plugin`` writes the generic one. ``grade_reference``: the built-in a ``grade`` run scores
    this kind against (None: not graded). The 0.1 constructor's positional arguments the adapter of
    :func:`instantiate` accepts are the base class's ``legacy_args``. ``provides``: other context
    field names this kind's plugin fills (besides ``name``), so a context naming one is built after it.
    """

    name: str
    base: type[Plugin]
    hook: str
    context: type
    default: str
    summary: str
    scope: str = "engine"
    group: str = ""
    checks: tuple[str, ...] = ()
    template: str | None = None
    guide: str | None = None
    grade_reference: str | None = None
    provides: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.name.isidentifier():
            raise ValueError(f"kind name {self.name!r} is not an identifier")
        if self.scope not in SCOPES:
            raise ValueError(f"kind {self.name!r}: scope {self.scope!r} is not one of {SCOPES}")
        if not (dataclasses.is_dataclass(self.context) and getattr(self.context, "__dataclass_params__").frozen):
            raise ValueError(f"kind {self.name!r}: its context {self.context!r} must be a frozen dataclass")
        if not self.group:
            object.__setattr__(self, "group", self.name)

    @property
    def legacy_args(self) -> tuple[str, ...]:
        """The 0.1 constructor's positional arguments after ``config`` (the base class says which)."""
        return getattr(self.base, "legacy_args", ())

    @property
    def hook_doc(self) -> str:
        return f"Return :class:`{self.base.__module__}.{self.base.__qualname__}` subclasses ({self.name} plugins)."


_ENGINE_SCENARIOS = ("scenarios", "state", "real_model")
_FAST_FORWARD = "servelab.kit.conformance_fast_forward:check_fast_forward"  # kinds that declare quiet steps
BUILTIN_KINDS = (
    KindSpec("scheduler", Scheduler, "servelab_register_schedulers", SchedulerContext, "fcfs",
             "which requests run each step and how many tokens each computes",
             checks=("scenarios", "state", "starvation", "slo_mix",
                     "servelab.kit.conformance_disagg:check_disaggregated", "real_model", _FAST_FORWARD),
             template="scheduler",
             guide="docs/write-a-scheduler.md", grade_reference="fcfs"),
    KindSpec("allocator", BlockAllocator, "servelab_register_allocators", AllocatorContext, "paged",
             "how KV-cache memory is carved into blocks", checks=("scenarios", "state", "real_model", _FAST_FORWARD),
             template="allocator",
             guide="docs/write-an-allocator.md", grade_reference="paged", provides=("block_events",)),
    KindSpec("preemption", PreemptionPolicy, "servelab_register_preemption_policies", PreemptionContext, "recompute",
             "victims when blocks run out, swapped or recomputed", checks=("scenarios", "real_model"),
             template="preemption", guide="docs/write-a-preemption-policy.md", grade_reference="recompute"),
    KindSpec("drafter", SpeculativeDrafter, "servelab_register_drafters", DrafterContext, "none",
             "speculative decoding: draft tokens the model verifies", checks=_ENGINE_SCENARIOS,
             template="drafter", guide="docs/write-a-drafter.md"),
    KindSpec("time_model", TimeModel, "servelab_register_time_models", TimeModelContext, "measured",
             "what a step costs on the virtual clock (the simulator's ground truth)",
             template="time_model", guide="docs/write-a-time-model.md"),
    KindSpec("length_predictor", LengthPredictor, "servelab_register_length_predictors", PredictorContext, "none",
             "output-length predictions for length-aware schedulers",
             checks=("scenarios", "real_model", "predictions"), template="length_predictor",
             guide="docs/write-a-length-predictor.md"),
    KindSpec("evictor", Evictor, "servelab_register_evictors", EvictorContext, "lru",
             "which cached prefix block a prefix cache gives up (allocator.prefix_caching=true)",
             checks=("evictor_script", "scenarios", "evictor_ladder", "real_model"), template="evictor",
             guide="docs/write-an-evictor.md", grade_reference="lru"),
    KindSpec("kv_tier_policy", KVTierPolicy, "servelab_register_kv_tier_policies", KVTierPolicyContext, "none",
             "what KV goes to the host / disk tiers below the GPU and comes back (kv_tiers=host|host_disk)",
             checks=("servelab.kit.conformance_kv_tiers:check_kv_tier_policy",),
             template="servelab.kit.kv_tier_policy_template:TEMPLATE", guide="docs/write-a-kv-tier-policy.md",
             grade_reference="write_back"),
    KindSpec("kv_connector", KVConnectorPlugin, "servelab_register_kv_connectors", KVConnectorContext, "none",
             "the door KV enters or leaves an engine by: tiers, the prefill/decode hand-off, a remote store",
             checks=("servelab.kit.conformance_kv_connector:check_kv_connector",),
             template="servelab.kit.kv_connector_template:TEMPLATE", guide="docs/write-a-kv-connector.md",
             provides=("connector",)),
    KindSpec("router", Router, "servelab_register_routers", RouterContext, "round_robin",
             "which replica of a cluster serves each request (cluster.replicas > 1)", scope="cluster",
             checks=("router", "servelab.cli.route_conformance:stage_behind_route"), template="router", guide="docs/write-a-router.md", grade_reference="round_robin"),
    KindSpec("migration_policy", MigrationPolicy, "servelab_register_migration_policies", MigrationPolicyContext,
             "none", "which running requests of a cluster move live to another replica, KV and all "
             "(cluster.replicas > 1)", scope="cluster",
             checks=("servelab.kit.conformance_migration:check_migration_policy",),
             template="servelab.kit.migration_policy_template:TEMPLATE", guide="docs/write-a-migration-policy.md",
             grade_reference="none"),
    KindSpec("autoscaler", Autoscaler, "servelab_register_autoscalers", AutoscalerContext, "none",
             "when a simulated cluster starts a replica (a priced cold start) or drains and retires one",
             scope="cluster", checks=("servelab.kit.conformance_autoscaler:check_autoscaler",),
             template="servelab.kit.autoscaler_template:TEMPLATE", guide="docs/write-an-autoscaler.md"),
    KindSpec("executor", Executor, "servelab_register_executors", ExecutorContext, "torch",
             "what runs the steps: the model in this process, over N ranks, or the simulator",
             scope="executor", group="backend"),
    KindSpec("expert_placement", ExpertPlacement, "servelab_register_expert_placements", ExpertPlacementContext,
             "linear", "which rank holds each MoE expert, replicas of hot ones, re-planned from measured load",
             checks=("servelab.kit.conformance_expert_placement:check_expert_placement",),
             template="servelab.kit.expert_placement_template:TEMPLATE", guide="docs/write-an-expert-placement.md"),
    KindSpec("expert_cache", ExpertCache, "servelab_register_expert_caches", ExpertCacheContext, "none",
             "which MoE experts stay on the GPU when the rest are offloaded to host memory (misses over the host link)",
             checks=("servelab.kit.conformance_expert_cache:check_expert_cache",),
             template="servelab.kit.expert_cache_template:TEMPLATE", guide="docs/write-an-expert-cache.md"),
)

#: kind name -> spec, in registration order (the built-ins first).
KINDS: dict[str, KindSpec] = {spec.name: spec for spec in BUILTIN_KINDS}


def register_kind(spec: KindSpec) -> KindSpec:
    """Add a kind to the table (a package's ``servelab_register_kinds`` hook returns specs; the
    registry calls this for each). Idempotent for the same spec; a different spec under a taken
    name, or a group another kind selects with, is refused."""
    known = KINDS.get(spec.name)
    if known is not None:
        if known != spec:
            raise ValueError(f"plugin kind {spec.name!r} is registered already (hook {known.hook})")
        return known
    if any(k.group == spec.group or k.hook == spec.hook for k in KINDS.values()):
        raise ValueError(f"plugin kind {spec.name!r}: config group {spec.group!r} or hook {spec.hook!r} is taken")
    KINDS[spec.name] = spec
    return spec


def by_group(group: str) -> KindSpec | None:
    """The kind selected with ``<group>=<plugin>``, if any."""
    return next((k for k in KINDS.values() if k.group == group), None)


def build_order(scope: str = "engine") -> list[KindSpec]:
    """The kinds of ``scope`` in an order where each comes after every kind its context names
    (a context field called ``allocator`` needs the allocator built first); ties keep table order."""
    specs = [k for k in KINDS.values() if k.scope == scope]
    owner = {alias: k.name for k in specs for alias in (k.name, *k.provides)}
    needs = {k.name: {owner[f.name] for f in dataclasses.fields(k.context) if f.name in owner} - {k.name}
             for k in specs}
    order: list[KindSpec] = []
    while specs:
        ready = [k for k in specs if needs[k.name] <= {o.name for o in order}]
        if not ready:
            raise ValueError(f"plugin kinds {[k.name for k in specs]} name each other in their contexts (a cycle)")
        order.append(ready[0])
        specs.remove(ready[0])
    return order


def build_context(spec: KindSpec, available: Mapping[str, Any]) -> Any:
    """``spec.context`` filled by field name from ``available`` (the run's values and the plugins
    built so far, by kind name); a field missing there takes its default, or the build fails
    naming the kind and the field."""
    values = {}
    for f in dataclasses.fields(spec.context):
        if f.name in available:
            values[f.name] = available[f.name]
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ConfigError(f"{spec.name}: its context {spec.context.__name__} needs {f.name!r}, which this run "
                              f"does not provide (it has: {', '.join(sorted(available))})")
    return spec.context(**values)


def instantiate(spec: KindSpec, cls: type, config: Any, context: Any) -> Any:
    """``cls(config, context)``; a class written to its kind's 0.1 constructor (positional
    collaborators after ``config``) is built through the adapter, with one warning per class."""
    if not takes_legacy_args(spec, cls):
        return cls(config, context)
    _warn_legacy(spec, cls)
    token = LEGACY_CONTEXT.set(context)
    try:
        return cls(config, *(getattr(context, name) for name in spec.legacy_args))
    finally:
        LEGACY_CONTEXT.reset(token)


def takes_legacy_args(spec: KindSpec, cls: type) -> bool:
    """Whether ``cls.__init__`` is a 0.1 constructor: its own (not a servelab base's), without
    ``*args``, naming the kind's old positional collaborators after ``config``."""
    if not spec.legacy_args:
        return False
    init = getattr(cls, "__init__")
    owner = next((c for c in cls.__mro__ if "__init__" in vars(c)), object)
    if owner.__module__.startswith(("servelab.core.", "servelab.engine.")):
        return False
    params = [p for p in list(inspect.signature(init).parameters.values())[1:]]
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return False  # forwards whatever it is given
    names = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if len(names) == 2 and names[1] in ("context", "ctx"):
        return False
    return names[1:] == list(spec.legacy_args) or (len(names) > 2 and len(names) - 1 == len(spec.legacy_args))


_warned: set[type] = set()


def _warn_legacy(spec: KindSpec, cls: type) -> None:
    if cls in _warned:
        return
    _warned.add(cls)
    old = ", ".join(("config", *spec.legacy_args))
    message = (f"{spec.name} plugin {getattr(cls, 'name', cls.__name__)!r} ({cls.__module__}.{cls.__qualname__}) "
               f"uses the 0.1 constructor __init__(self, {old}); it runs through an adapter for one release. "
               f"Write __init__(self, config, context: {spec.context.__name__}) and read "
               f"context.{', context.'.join(spec.legacy_args)}")
    warnings.warn(message, DeprecationWarning, stacklevel=3)
    log.warning("%s", message)


def resolve(ref: str) -> Any:
    """``"package.module:attr"`` -> the attribute (for what a kind names in a layer above core)."""
    module, _, attr = ref.partition(":")
    obj = importlib.import_module(module)
    for part in filter(None, attr.split(".")):
        obj = getattr(obj, part)
    return obj


def kinds_of(scope: str) -> Iterable[KindSpec]:
    return (k for k in KINDS.values() if k.scope == scope)
