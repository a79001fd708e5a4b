"""Test a plugin without a model: ``from servelab.testing import ...`` in a plugin package's tests.

:mod:`servelab.plugin_api` is what a plugin *module* imports (the contract, torch-free); this is
what its *tests* import. It loads torch and Hydra (the doubles run the engine, ``compose`` is
Hydra's), so a plugin module itself never imports it.

- doubles: :class:`FakeExecutor` (deterministic tokens and step times), :class:`KVCheckingExecutor`
  (samples from the KV it reads back through the block tables), :class:`VirtualClock`,
  :class:`StepTimeModel`, :func:`fake_spec`;
- a stack on them: :func:`registry_with` (the built-ins plus your plugin modules, composable as
  ``<kind>=<name>``), :func:`compose` (the config ``python run.py <overrides>`` would run),
  :func:`fake_stack` (that config's stack on a fake executor and a virtual clock; ``.engine``),
  :func:`run_workload` (feed requests as they arrive, step until all ended);
- the conformance kit: :func:`check_plugin` and its :class:`Report` (``servelab check-plugin``);
- a whole run that writes its result files: :func:`run_job`.

Before the layered sub-packages ``servelab.testing`` was the doubles' module (now
:mod:`servelab.kit.testing`): every name it had is here too.
"""

from __future__ import annotations

import importlib.metadata
from types import ModuleType

from servelab.api import compose
from servelab.core.hookspecs import PROJECT
from servelab.core.registry import PluginManager, Registry, build_registry, plugin_manager
from servelab.kit.conformance import Report, check_plugin
from servelab.kit.testing import FakeExecutor, KVCheckingExecutor, StepTimeModel, VirtualClock, fake_spec
from servelab.config import register_configs
from servelab.run.runner import run_workload
from servelab.run.session import run_job
from servelab.assemble.stack import Stack, build_stack

__all__ = ["FakeExecutor", "KVCheckingExecutor", "VirtualClock", "StepTimeModel", "fake_spec",
           "registry_with", "compose", "fake_stack", "run_workload", "check_plugin", "Report", "run_job"]


def servelab_plugin_manager() -> PluginManager:
    """A plugin manager holding servelab's own plugins only (the entry points of the ``servelab``
    distribution: the built-in policies and executors); register yours on it, then
    ``build_registry(pm)``."""
    pm = plugin_manager(load_entry_points=False)
    for ep in importlib.metadata.distribution("servelab").entry_points:
        if ep.group == PROJECT:
            pm.register(ep.load(), name=ep.name)
    return pm


def registry_with(*modules: ModuleType) -> Registry:
    """A registry of servelab's own plugins (the built-in policies and executors: the entry points
    of the ``servelab`` distribution) and ``modules`` (each a module with ``@hookimpl`` hooks, as
    its entry point would name it), their configs put in Hydra's ConfigStore so that
    ``compose(["scheduler=<yours>"])`` selects them. Other installed plugin packages are not
    loaded: the test sees exactly these plugins."""
    pm = servelab_plugin_manager()
    for module in modules:
        pm.register(module)
    registry = build_registry(pm)
    register_configs(registry)
    return registry


def fake_stack(cfg, registry: Registry | None = None, *, num_kv_blocks: int = 64, kv_checking: bool = False,
               **executor_options) -> Stack:
    """The stack ``cfg`` selects (plugins from ``registry``, default: the installed ones) on a
    :class:`FakeExecutor` with ``num_kv_blocks`` KV blocks (a :class:`KVCheckingExecutor` with
    ``kv_checking``; ``cfg.block_size`` must then be a number) and a :class:`VirtualClock`
    (``stack.engine.clock``): no model, milliseconds a run. ``executor_options`` go to the
    executor (``vocab_size``, ``step_time``, ``num_swap_blocks``, ...)."""
    clock = VirtualClock()
    executor: FakeExecutor
    if kv_checking:
        executor = KVCheckingExecutor(clock, num_kv_blocks, cfg.block_size, **executor_options)
    else:
        executor = FakeExecutor(clock, num_kv_blocks, **executor_options)
    return build_stack(cfg, registry, executor=executor, clock=clock)
