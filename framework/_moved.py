"""Old import paths, kept until servelab 0.2.0 (:data:`REMOVED_IN`): ``servelab.<old>`` -> its new home.

Until the layered sub-packages (Dec 2026, still version 0.1.0) the package was one flat floor of
modules (``servelab.interfaces``, ``servelab.scheduling``, ``servelab.testing``, ...), and the
guides of the time taught those paths. A plugin written against them still imports: this finder
answers an old name with the new module itself (same objects, so ``isinstance`` and subclassing
hold) and warns once with a :class:`DeprecationWarning` naming the new path. New code imports
:mod:`servelab.plugin_api` (plugins) or the new modules.

Only names that are no module of their own are listed (an old ``servelab.engine`` or
``servelab.serve`` is today's package of that name; ``servelab.run.stack`` is listed because
``run/stack.py`` is gone while ``servelab.run`` stays a package), and the finder sits first on
``sys.meta_path``, so a dotted old name (``servelab.model.llama``) is the new module too rather
than a second copy loaded through the aliased package's folder; a real module always wins (the
finder steps aside for a name that has a file of its own, as ``servelab.testing`` has now).
tests/test_moved_paths.py imports every entry.
"""

from __future__ import annotations

import functools
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import warnings

#: The release that drops this module (tests/test_moved_paths.py fails once the version reaches it).
REMOVED_IN = "0.2.0"

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
    "scheduling": "engine.scheduling",
    "batch": "engine.batch",
    "clock": "engine.clock",
    "drafting": "engine.drafting",
    "swap_pool": "assemble.swap_pool",
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
    "workload_text": "workloads.text_prompts",
    "workload_hash_ids": "workloads.hash_ids",
    "corpus": "workloads.corpus",
    "text": "workloads.text",
    "chat": "workloads.chat",
    "stack": "assemble.stack",
    "session": "run.session",
    "runner": "run.runner",
    "loggers": "results.loggers",
    "metrics": "results.metrics",
    "report": "results.report",
    "banner": "results.banner",
    "preflight": "assemble.preflight",
    "serve_app": "serve.app",
    "serve_engine": "serve.engine_thread",
    "serve_metrics": "serve.metrics",
    "serve_protocol": "serve.protocol",
    "conformance": "kit.conformance",
    "conformance_cases": "kit.conformance_cases",
    "conformance_starvation": "kit.conformance_starvation",
    "grading": "kit.grading",
    "grade_workloads": "kit.grade_workloads",
    "new_plugin": "kit.new_plugin",
    "plugin_templates": "kit.plugin_templates",
    "compare": "cli.compare",
    "eval_ppl": "cli.eval_ppl",
    "usage": "cli.usage",
    "profiling": "cli.profile",
    # the concerns that left run/, cluster/, serve/ and exec/ for folders of their own (Dec 7)
    "run.config": "config",
    "run.stack": "assemble.stack",
    "run.block_size": "assemble.block_size",
    "run.preflight": "assemble.preflight",
    "run.swap_pool": "assemble.swap_pool",
    "run.results": "results.writer",
    "run.metrics": "results.metrics",
    "run.fairness": "results.fairness",
    "run.report": "results.report",
    "run.loggers": "results.loggers",
    "run.banner": "results.banner",
    "run.replica_report": "results.replica_report",
    "run.cluster_summary": "results.cluster_summary",
    "cluster.figures": "results.cluster_figures",
    "run.kv_tier_store": "kv.tiers.store",
    "run.kv_tier_shared": "kv.tiers.shared",
    "run.kv_tier_build": "kv.tiers.build",
    "run.kv_tier_figures": "kv.tiers.figures",
    "run.kv_tier_cluster_figures": "kv.tiers.cluster_figures",
    "exec.kv_tier_pools": "kv.tiers.pools",
    "cluster.pd_connector": "kv.pd.sim",
    "cluster.transfer": "kv.link",
    "exec.local_connector": "kv.pd.local",
    "exec.process_connector": "kv.pd.process",
    "cluster.cluster": "cluster.simulated",
    "run.cluster_build": "cluster.build",
    "run.proc_cluster": "cluster.procs.cluster",
    "run.proc_engine": "cluster.procs.engine",
    "run.proc_replica": "cluster.procs.replica",
    "run.proc_cluster_job": "run.process_cluster",
    "serve.route_app": "serve.route.app",
    "serve.route_backends": "serve.route.backends",
    "serve.route_command": "serve.route.command",
    "serve.route_launch": "serve.route.launch",
    "serve.route_metrics": "serve.route.metrics",
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
        head, dot, _ = old.partition(".")
        if _is_a_module(head) and (not dot or importlib.machinery.PathFinder.find_spec(fullname, path) is not None):
            return None  # a real module wins (a moved module's package, servelab.run, is still one)
        new = "servelab." + new
        warnings.warn(f"{fullname} moved to {new} (the old path goes in servelab {REMOVED_IN}); plugins "
                      "import servelab.plugin_api", DeprecationWarning, stacklevel=3)
        return importlib.util.spec_from_loader(fullname, _Alias(new))


@functools.lru_cache(maxsize=None)
def _is_a_module(name: str) -> bool:
    """Whether ``servelab.<name>`` is a module or package of its own (then it is not an old path)."""
    top = sys.modules.get("servelab")
    return importlib.machinery.PathFinder.find_spec(f"servelab.{name}", getattr(top, "__path__", None)) is not None


def install() -> None:
    """Put the finder first on ``sys.meta_path``, once: before the path finder, which would load
    ``servelab.model.llama`` a second time from the folder of the aliased ``servelab.model``. It
    answers only the names in :data:`MOVED`, none of which is a module of its own."""
    if not any(isinstance(f, MovedModuleFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, MovedModuleFinder())
