"""servelab's built-in plugins, registered through the ``servelab`` entry point like any other.

Each sub-package is named after its kind (``schedulers`` for ``scheduler``, ``preemption`` for
``preemption``) and lists its classes in ``BUILTIN`` (in its ``__init__``). The hook implementations
below are made from the kinds table, one per sub-package, so a kind's built-ins need no line here.
"""

from __future__ import annotations

import importlib
import pkgutil

from servelab.plugin_api import KINDS, hookimpl


def _registration(package: str):
    def register() -> list[type]:
        return list(importlib.import_module(package).BUILTIN)  # imported when the registry is built

    return register


def _kind_of(folder: str):
    return next((k for k in KINDS.values() if folder in (k.name, k.name + "s", k.name[:-1] + "ies")), None)


_PLUGINS = importlib.import_module(__package__)
for _info in pkgutil.iter_modules(_PLUGINS.__path__):
    _kind = _kind_of(_info.name) if _info.ispkg else None
    if _kind is not None:
        _impl = _registration(f"{__package__}.{_info.name}")
        _impl.__name__ = _kind.hook
        globals()[_kind.hook] = hookimpl(_impl)
