"""Plugin discovery: entry points (group ``servelab``) -> pluggy hooks -> ``name -> class``.

Built-ins come in through this project's own entry point, exactly like a third-party package.
Start-up fails loudly on a duplicate name or a class of the wrong kind. A package whose entry
point fails to *import* is isolated instead: it is reported in one line (package, entry point,
error) as a warning, runs that do not select it go on, and selecting a name it may have provided
fails with that line (:meth:`Registry.get`, :func:`check_selection`).
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import logging
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Iterable

import pluggy

from servelab.core import hookspecs
from servelab.core.errors import ServelabError
from servelab.core.kinds import KINDS, KindSpec, register_kind

log = logging.getLogger(__name__)


class PluginError(ServelabError):
    """A plugin could not be registered or found."""


@dataclass(frozen=True)
class BrokenEntryPoint:
    """An entry point of the ``servelab`` group that raised when imported."""

    distribution: str  # "name version"
    entry_point: str  # "name = module:attr"
    error: str  # "ModuleNotFoundError: No module named 'x'"

    def line(self) -> str:
        return (f"plugin package {self.distribution} (entry point {self.entry_point}) failed to import: "
                f"{self.error}")


@dataclass
class Registry:
    """``kind -> name -> class`` plus where each class came from (for error messages)."""

    plugins: dict[str, dict[str, type]] = field(default_factory=dict)
    origins: dict[tuple[str, str], str] = field(default_factory=dict)
    broken: list[BrokenEntryPoint] = field(default_factory=list)  # packages that failed to import

    def add(self, kind: str, cls: type, origin: str) -> None:
        """Register ``cls`` under ``kind``; raise :class:`PluginError` on a bad or duplicate one."""
        base = KINDS[kind].base
        if not (isinstance(cls, type) and issubclass(cls, base)):
            raise PluginError(f"{origin} registered {cls!r} as a {kind}, but it is not a subclass of "
                              f"{base.__module__}.{base.__name__}")
        name = getattr(cls, "name", None)
        if not isinstance(name, str) or not name.isidentifier():
            raise PluginError(f"{origin}: {kind} class {cls.__qualname__} needs a `name` that is an identifier, got {name!r}")
        if not dataclasses.is_dataclass(cls.Config):
            raise PluginError(f"{origin}: {kind} {name!r} has a Config that is not a dataclass")
        if name in self.plugins.get(kind, {}):
            raise PluginError(f"duplicate {kind} name {name!r}: registered by {self.origins[(kind, name)]} "
                              f"and again by {origin}")
        self.plugins.setdefault(kind, {})[name] = cls
        self.origins[(kind, name)] = origin

    def get(self, kind: str, name: str) -> type[Any]:
        """The class registered as ``name``; an unknown name lists the known ones."""
        if kind not in KINDS:
            raise PluginError(f"unknown plugin kind {kind!r}; kinds: {sorted(KINDS)}")
        try:
            return self.plugins[kind][name]
        except KeyError:
            known = ", ".join(self.names(kind)) or "(none)"
            raise PluginError(f"unknown {kind} {name!r}; registered {kind}s: {known}" + self.broken_note()) from None

    def broken_note(self) -> str:
        """``"; <one line per broken package>"`` (the name asked for may be one of theirs), or ``""``."""
        return "".join(f"; {b.line()}" for b in self.broken)

    def names(self, kind: str) -> list[str]:
        return sorted(self.plugins.get(kind, {}))


@dataclass
class _Loaded:
    """What :func:`load_entry_points` found: each loaded plugin's distribution, and the failures."""

    distributions: dict[str, str] = field(default_factory=dict)  # plugin name in pm -> "name version"
    broken: list[BrokenEntryPoint] = field(default_factory=list)


class PluginManager(pluggy.PluginManager):
    """pluggy's manager, remembering what its entry points loaded (and what failed to)."""

    def __init__(self) -> None:
        super().__init__(hookspecs.PROJECT)
        self.add_hookspecs(hookspecs.KindHooks)
        self._specified: set[str] = set()
        self.add_kind_hookspecs()
        self.loaded = _Loaded()

    def add_kind_hookspecs(self) -> None:
        """One registration hook spec per kind of the table not specified yet."""
        new = [k for k in KINDS.values() if k.hook not in self._specified]
        if new:
            self.add_hookspecs(hookspecs.namespace(new))
            self._specified.update(k.hook for k in new)


def plugin_manager(load_entry_points: bool = True) -> PluginManager:
    pm = PluginManager()
    if load_entry_points:
        pm.loaded = _load_entry_points(pm)
    return pm


def _load_entry_points(pm: pluggy.PluginManager) -> _Loaded:
    """pluggy's ``load_setuptools_entrypoints``, except that an entry point raising on import is
    recorded (not raised): one broken package must not break every run in the environment."""
    loaded = _Loaded()
    for dist in list(importlib.metadata.distributions()):
        label = ""  # read only for a package with our entry points: parsing all METADATA cost ~0.17 s per start
        for ep in dist.entry_points:
            if ep.group != hookspecs.PROJECT or pm.get_plugin(ep.name) or pm.is_blocked(ep.name):
                continue
            label = label or f"{dist.metadata['name']} {dist.version}"
            try:
                plugin = ep.load()
            except Exception as exc:  # noqa: BLE001 - any import-time failure isolates that package
                loaded.broken.append(BrokenEntryPoint(label, f"{ep.name} = {ep.value}", f"{type(exc).__name__}: {exc}"))
                continue
            pm.register(plugin, name=ep.name)
            loaded.distributions[ep.name] = label
    return loaded


def build_registry(pm: pluggy.PluginManager) -> Registry:
    """Call every registration hook of every plugin and build the registry."""
    loaded = getattr(pm, "loaded", None) or _Loaded()  # a plain pluggy manager has loaded nothing
    registry = Registry(broken=list(loaded.broken))
    _add_kinds(pm, loaded)
    for kind, spec in KINDS.items():
        hook = getattr(pm.hook, spec.hook, None)
        if hook is None:  # a plain pluggy manager without this kind's spec: nobody implements it
            continue
        for impl in hook.get_hookimpls():
            origin = pm.get_name(impl.plugin) or repr(impl.plugin)
            dist = loaded.distributions.get(origin)
            if dist:
                origin = f"{origin} (from {dist})"
            for cls in impl.function() or []:
                registry.add(kind, cls, origin)
    return registry


def _add_kinds(pm: pluggy.PluginManager, loaded: _Loaded) -> None:
    """Put the kinds packages contribute (``servelab_register_kinds``) into the table, and their
    hook specs into ``pm``; a bad kind spec is a :class:`PluginError` naming the package."""
    hook = getattr(pm.hook, "servelab_register_kinds", None)
    if hook is None:
        return
    for impl in hook.get_hookimpls():
        origin = pm.get_name(impl.plugin) or repr(impl.plugin)
        for spec in impl.function() or []:
            if not isinstance(spec, KindSpec):
                raise PluginError(f"{origin}: servelab_register_kinds returned {spec!r}, not a KindSpec")
            try:
                register_kind(spec)
            except ValueError as exc:
                raise PluginError(f"{origin}: {exc}") from None
    if isinstance(pm, PluginManager):
        pm.add_kind_hookspecs()


@lru_cache(maxsize=1)
def default_registry() -> Registry:
    """The registry built from installed entry points (cached for the process); each package that
    failed to import is logged once as a warning."""
    registry = build_registry(plugin_manager())
    for broken in registry.broken:
        log.warning("servelab: %s; runs that do not select its plugins go on", broken.line())
    if not registry.plugins.get("scheduler"):
        raise PluginError("no schedulers registered: is servelab installed (pip install -e .)? "
                          "Its built-ins come in through the `servelab` entry-point group."
                          + registry.broken_note())
    return registry


def check_selection(overrides: Iterable[str], registry: Registry | None = None) -> None:
    """Raise :class:`PluginError` when an override selects a plugin name that is not registered
    while some package failed to import (the name may be one of its plugins): Hydra would only
    say the option is missing, without the cause."""
    registry = registry or default_registry()
    if not registry.broken:
        return
    for override in overrides:
        key, sep, value = override.lstrip("+~").partition("=")
        spec = next((k for k in KINDS.values() if k.group == key), None) if sep else None
        if spec is not None:
            for name in value.split(","):  # a multirun sweep: a,b
                if name.isidentifier() and name not in registry.plugins.get(spec.name, {}):
                    registry.get(spec.name, name)  # raises, naming the broken packages
