"""The simulator's registration: ``backend=sim``, through this project's ``servelab`` entry point
``sim`` like any third-party executor package."""

from __future__ import annotations

from servelab.core.hookspecs import hookimpl


@hookimpl
def servelab_register_executors() -> list[type]:
    from servelab.sim.executor import SimExecutor  # noqa: PLC0415 - loaded when the registry is built

    return [SimExecutor]
