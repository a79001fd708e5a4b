"""servelab's built-in plugins, registered through the ``servelab`` entry point like any other."""

from servelab.hookspecs import hookimpl


@hookimpl
def servelab_register_schedulers():
    from .schedulers.fcfs import FCFSScheduler

    return [FCFSScheduler]


@hookimpl
def servelab_register_allocators():
    from .allocators.paged import PagedAllocator

    return [PagedAllocator]


@hookimpl
def servelab_register_preemption_policies():
    from .preemption.recompute import RecomputePreemption

    return [RecomputePreemption]


@hookimpl
def servelab_register_drafters():
    from .drafters.none import NoDrafter

    return [NoDrafter]
