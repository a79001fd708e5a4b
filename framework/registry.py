"""Plugin discovery: entry points (group ``servelab``) -> pluggy hooks -> ``name -> class``.

Built-ins come in through this project's own entry point, exactly like a third-party package.
Start-up fails loudly on a duplicate name or a class of the wrong kind.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from functools import lru_cache

import pluggy

from . import hookspecs
from .errors import ServelabError
from .interfaces import BlockAllocator, PreemptionPolicy, Scheduler, SpeculativeDrafter, TimeModel

KINDS: dict[str, tuple[type, str]] = {
    # config group -> (base class, hook name)
    "scheduler": (Scheduler, "servelab_register_schedulers"),
    "allocator": (BlockAllocator, "servelab_register_allocators"),
    "preemption": (PreemptionPolicy, "servelab_register_preemption_policies"),
    "drafter": (SpeculativeDrafter, "servelab_register_drafters"),
    "time_model": (TimeModel, "servelab_register_time_models"),
}


class PluginError(ServelabError):
    """A plugin could not be registered or found."""


@dataclass
class Registry:
    """``kind -> name -> class`` plus where each class came from (for error messages)."""

    plugins: dict[str, dict[str, type]] = field(default_factory=lambda: {k: {} for k in KINDS})
    origins: dict[tuple[str, str], str] = field(default_factory=dict)

    def add(self, kind: str, cls: type, origin: str) -> None:
        """Register ``cls`` under ``kind``; raise :class:`PluginError` on a bad or duplicate one."""
        base, _ = KINDS[kind]
        if not (isinstance(cls, type) and issubclass(cls, base)):
            raise PluginError(f"{origin} registered {cls!r} as a {kind}, but it is not a subclass of "
                              f"{base.__module__}.{base.__name__}")
        name = getattr(cls, "name", None)
        if not isinstance(name, str) or not name.isidentifier():
            raise PluginError(f"{origin}: {kind} class {cls.__qualname__} needs a `name` that is an identifier, got {name!r}")
        if not dataclasses.is_dataclass(cls.Config):
            raise PluginError(f"{origin}: {kind} {name!r} has a Config that is not a dataclass")
        if name in self.plugins[kind]:
            raise PluginError(f"duplicate {kind} name {name!r}: registered by {self.origins[(kind, name)]} "
                              f"and again by {origin}")
        self.plugins[kind][name] = cls
        self.origins[(kind, name)] = origin

    def get(self, kind: str, name: str) -> type:
        """The class registered as ``name``; an unknown name lists the known ones."""
        if kind not in KINDS:
            raise PluginError(f"unknown plugin kind {kind!r}; kinds: {sorted(KINDS)}")
        try:
            return self.plugins[kind][name]
        except KeyError:
            known = ", ".join(sorted(self.plugins[kind])) or "(none)"
            raise PluginError(f"unknown {kind} {name!r}; registered {kind}s: {known}") from None

    def names(self, kind: str) -> list[str]:
        return sorted(self.plugins[kind])


def plugin_manager(load_entry_points: bool = True) -> pluggy.PluginManager:
    pm = pluggy.PluginManager(hookspecs.PROJECT)
    pm.add_hookspecs(hookspecs)
    if load_entry_points:
        pm.load_setuptools_entrypoints(hookspecs.PROJECT)
    return pm


def build_registry(pm: pluggy.PluginManager) -> Registry:
    """Call every registration hook of every plugin and build the registry."""
    registry = Registry()
    for kind, (_, hook_name) in KINDS.items():
        hook = getattr(pm.hook, hook_name)
        for impl in hook.get_hookimpls():
            origin = pm.get_name(impl.plugin) or repr(impl.plugin)
            dist = _distribution_of(pm, impl.plugin)
            if dist:
                origin = f"{origin} (from {dist})"
            for cls in impl.function() or []:
                registry.add(kind, cls, origin)
    return registry


def _distribution_of(pm: pluggy.PluginManager, plugin: object) -> str | None:
    for plugin_obj, dist in pm.list_plugin_distinfo():
        if plugin_obj is plugin:
            return f"{dist.metadata['name']} {dist.version}"
    return None


@lru_cache(maxsize=1)
def default_registry() -> Registry:
    """The registry built from installed entry points (cached for the process)."""
    registry = build_registry(plugin_manager())
    if not registry.plugins["scheduler"]:
        raise PluginError("no schedulers registered: is servelab installed (pip install -e .)? "
                          "Its built-ins come in through the `servelab` entry-point group.")
    return registry
