"""Old import paths, kept for one release (0.1 -> 0.2): ``servelab.<old>`` -> its new home.

Before 0.2 the package was one flat floor of modules (``servelab.interfaces``,
``servelab.scheduling``, ``servelab.testing``, ...). A plugin written against those paths still
imports: this finder answers an old name with the new module itself (same objects, so
``isinstance`` and subclassing hold) and warns once with a :class:`DeprecationWarning` naming the
new path. New code imports :mod:`servelab.plugin_api` (plugins) or the new modules.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

MOVED: dict[str, str] = {
    "interfaces": "core.interfaces",
    "request": "core.request",
    "registry": "core.registry",
    "hookspecs": "core.hookspecs",
    "errors": "core.errors",
    "shapes": "core.shapes",
    "step_work": "core.step_work",
    "cost_model": "core.cost_model",
    "seeds": "core.seeds",
    "engine": "engine.engine",
    "scheduling": "engine.scheduling",
    "batch": "engine.batch",
    "clock": "engine.clock",
    "drafting": "engine.drafting",
    "swap_pool": "run.swap_pool",
    "step_totals": "engine.step_totals",
    "executor": "exec.executor",
    "kv_pool": "exec.kv_pool",
    "sampler": "exec.sampler",
    "quant": "exec.quant",
    "tp": "exec.tp",
    "tp_comm": "exec.tp_comm",
    "tp_worker": "exec.tp_worker",
    "model": "exec.model",
    "model.layers": "exec.model.layers",
    "model.llama": "exec.model.llama",
    "model.loader": "exec.model.loader",
    "model.random_checkpoint": "exec.model.random_checkpoint",
    "model.spec": "core.model_spec",
    "sim_executor": "sim.executor",
    "step_profile": "sim.step_profile",
    "workloads": "workloads.build",
    "workload_text": "workloads.text_prompts",
    "workload_hash_ids": "workloads.hash_ids",
    "corpus": "workloads.corpus",
    "text": "workloads.text",
    "chat": "workloads.chat",
    "config": "run.config",
    "stack": "run.stack",
    "session": "run.session",
    "runner": "run.runner",
    "loggers": "run.loggers",
    "metrics": "run.metrics",
    "report": "run.report",
    "banner": "run.banner",
    "preflight": "run.preflight",
    "serve": "serve.command",
    "serve_app": "serve.app",
    "serve_engine": "serve.engine_thread",
    "serve_metrics": "serve.metrics",
    "serve_protocol": "serve.protocol",
    "conformance": "kit.conformance",
    "conformance_cases": "kit.conformance_cases",
    "conformance_starvation": "kit.conformance_starvation",
    "testing": "kit.testing",
    "grading": "kit.grading",
    "grade_workloads": "kit.grade_workloads",
    "new_plugin": "kit.new_plugin",
    "plugin_templates": "kit.plugin_templates",
    "cli": "cli.main",
    "compare": "cli.compare",
    "eval_ppl": "cli.eval_ppl",
    "usage": "cli.usage",
    "profiling": "cli.profile",
}


class _Alias(importlib.abc.Loader):
    def __init__(self, new: str) -> None:
        self.new = new

    def create_module(self, spec):
        module = importlib.import_module(self.new)
        self._spec = module.__spec__
        return module

    def exec_module(self, module) -> None:
        module.__spec__ = self._spec  # importlib stamped the old name's spec on it; the module is the new one


class MovedModuleFinder(importlib.abc.MetaPathFinder):
    """Finds ``servelab.<old>`` for every old name in :data:`MOVED`."""

    def find_spec(self, fullname, path=None, target=None):
        if not fullname.startswith("servelab."):
            return None
        old = fullname[len("servelab."):]
        new = MOVED.get(old)
        if new is None:
            return None
        new = "servelab." + new
        warnings.warn(f"{fullname} moved to {new} (servelab 0.2; the old path goes in 0.3); plugins "
                      "import servelab.plugin_api", DeprecationWarning, stacklevel=3)
        return importlib.util.spec_from_loader(fullname, _Alias(new))


def install() -> None:
    """Put the finder on ``sys.meta_path`` once."""
    if not any(isinstance(f, MovedModuleFinder) for f in sys.meta_path):
        sys.meta_path.append(MovedModuleFinder())
