"""pluggy hook specifications: each hook returns the plugin classes a package contributes.

A package registers its plugins by declaring an entry point in the ``servelab`` group that
points at a module (or object) implementing any of these hooks with ``@servelab.hookimpl``.
"""

from __future__ import annotations

import pluggy

PROJECT = "servelab"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def servelab_register_schedulers() -> list[type]:
    """Return :class:`~servelab.core.interfaces.Scheduler` subclasses."""


@hookspec
def servelab_register_allocators() -> list[type]:
    """Return :class:`~servelab.core.interfaces.BlockAllocator` subclasses."""


@hookspec
def servelab_register_preemption_policies() -> list[type]:
    """Return :class:`~servelab.core.interfaces.PreemptionPolicy` subclasses."""


@hookspec
def servelab_register_drafters() -> list[type]:
    """Return :class:`~servelab.core.interfaces.SpeculativeDrafter` subclasses."""


@hookspec
def servelab_register_time_models() -> list[type]:
    """Return :class:`~servelab.core.interfaces.TimeModel` subclasses."""


@hookspec
def servelab_register_length_predictors() -> list[type]:
    """Return :class:`~servelab.core.interfaces.LengthPredictor` subclasses."""


@hookspec
def servelab_register_evictors() -> list[type]:
    """Return :class:`~servelab.core.interfaces.Evictor` subclasses."""


@hookspec
def servelab_register_routers() -> list[type]:
    """Return :class:`~servelab.core.interfaces.Router` subclasses."""
