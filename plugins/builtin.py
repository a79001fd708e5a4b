"""servelab's built-in plugins, registered through the ``servelab`` entry point like any other.

Each kind's folder lists its classes in ``BUILTIN`` (in its ``__init__``).
"""

from servelab.core.hookspecs import hookimpl


@hookimpl
def servelab_register_schedulers():
    from .schedulers import BUILTIN

    return BUILTIN


@hookimpl
def servelab_register_allocators():
    from .allocators import BUILTIN

    return BUILTIN


@hookimpl
def servelab_register_preemption_policies():
    from .preemption import BUILTIN

    return BUILTIN


@hookimpl
def servelab_register_drafters():
    from .drafters import BUILTIN

    return BUILTIN


@hookimpl
def servelab_register_time_models():
    from .time_models import BUILTIN

    return BUILTIN


@hookimpl
def servelab_register_length_predictors():
    from .length_predictors import BUILTIN

    return BUILTIN


@hookimpl
def servelab_register_evictors():
    from .evictors import BUILTIN

    return BUILTIN


@hookimpl
def servelab_register_routers():
    from .routers import BUILTIN

    return BUILTIN
