"""The real executors' registration: ``backend=local``, ``backend=tp`` and ``backend=torch`` (which
picks one of them by ``tensor_parallel_size``), through this project's ``servelab`` entry point
``executors`` like any third-party executor package."""

from __future__ import annotations

import importlib
from typing import ClassVar

from servelab.core.batch import StepBatch
from servelab.core.contexts import ExecutorContext
from servelab.core.executor import BackendConfig, Executor, StepOutput
from servelab.core.hookspecs import hookimpl


class TorchBackend(Executor):
    """``backend=torch`` (the default): ``local`` when ``tensor_parallel_size`` and ``pipeline_parallel_size``
    are 1, ``tp`` above.
    Building one returns the chosen executor itself."""

    name = "torch"

    def __new__(cls, config: BackendConfig, context: ExecutorContext):  # type: ignore[misc]
        from servelab.exec.executor import LocalExecutor  # noqa: PLC0415 - torch, when a run builds one
        from servelab.exec.tp import TPExecutor  # noqa: PLC0415

        ranks = context.tensor_parallel_size * context.pipeline_parallel_size
        return (TPExecutor if ranks > 1 else LocalExecutor)(config, context)

    def execute(self, batch: StepBatch) -> StepOutput:  # never called: __new__ returns another executor
        raise NotImplementedError


class _Deferred(Executor):
    """Registered in place of a torch executor, so that building the registry (every command,
    the simulator's too) loads no torch: building one builds ``target`` (``"module:Class"``)."""

    target: ClassVar[str]

    def __new__(cls, config: BackendConfig, context: ExecutorContext):  # type: ignore[misc]
        module, name = cls.target.split(":")
        return getattr(importlib.import_module(module), name)(config, context)

    def execute(self, batch: StepBatch) -> StepOutput:  # never called: __new__ returns another executor
        raise NotImplementedError


class LocalBackend(_Deferred):
    """``backend=local``: one worker in this process (:class:`servelab.exec.executor.LocalExecutor`)."""

    name = "local"
    target = "servelab.exec.executor:LocalExecutor"


class TPBackend(_Deferred):
    """``backend=tp``: the model sharded over processes (:class:`servelab.exec.tp.TPExecutor`)."""

    name = "tp"
    target = "servelab.exec.tp:TPExecutor"


@hookimpl
def servelab_register_executors() -> list[type]:
    return [TorchBackend, LocalBackend, TPBackend]
