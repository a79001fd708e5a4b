"""pluggy hook specifications: each hook returns the plugin classes a package contributes.

A package registers its plugins by declaring an entry point in the ``servelab`` group that
points at a module (or object) implementing any of these hooks with ``@servelab.hookimpl``.
There is one hook per plugin kind, named in the kind's row of :data:`servelab.core.kinds.KINDS`
(``servelab_register_schedulers``, ``servelab_register_allocators``, ...): :func:`namespace`
makes their specs from that table. ``servelab_register_kinds`` adds kinds to the table.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable

if TYPE_CHECKING:
    from servelab.core.kinds import KindSpec

import pluggy

PROJECT = "servelab"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


class KindHooks:
    """The hook that adds plugin kinds (its specs are made before the per-kind hooks are)."""

    @staticmethod
    @hookspec
    def servelab_register_kinds() -> list[KindSpec]:
        """Return :class:`~servelab.core.kinds.KindSpec` s of new plugin kinds (each then has its own
        registration hook, config group, ``check-plugin`` and ``new-plugin``)."""
        return []  # the spec's body is never called


def namespace(kinds: Iterable[KindSpec]) -> type:
    """A class holding one hook spec per kind of ``kinds`` (``KindSpec`` s), for ``add_hookspecs``."""
    attrs: dict[str, Any] = {}
    for kind in kinds:
        def register() -> list[type]:  # the spec's body is never called
            return []
        register.__name__ = register.__qualname__ = kind.hook
        register.__doc__ = kind.hook_doc
        attrs[kind.hook] = staticmethod(hookspec(register))
    return type("KindRegistrationHooks", (), attrs)
