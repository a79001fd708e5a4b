"""Tensor, expert and pipeline parallelism: rank 0 (this process) coordinates N-1 spawned worker processes.

``N = tensor_parallel_size x pipeline_parallel_size``: each pipeline stage holds its share of the layers
(vLLM's split) on ``tensor_parallel_size`` ranks, a MoE layer's experts split ``expert_parallel_size``
ways over them (:mod:`servelab.exec.model.moe`). Stages run one after the other within a step (one
batch in flight: the tokens equal one process's; the overlap of several batches is the simulator's to price).

Rank 0 runs the engine, scheduler and allocator, and its own shard of the model. Each step it
broadcasts the batch (see :mod:`servelab.exec.tp_comm`) and every rank runs its shard; rank 0's sampled
tokens are the step's result. The KV pool is the minimum any rank can hold, so one allocator's
decisions hold on every rank; block copy and swap operations travel with the plan and run on
every shard.

Faults: before each step rank 0 checks that every worker is alive; during a step every collective
is bounded by ``step_timeout_s`` and a dead peer breaks gloo's connection at once. Either way the
step raises :class:`TPWorkerError` naming the rank, and :meth:`TPExecutor.shutdown` (also run at
interpreter exit) stops every worker, killing those that do not stop by themselves.

On CUDA the forward's collectives are NCCL: a peer that dies or hangs inside the forward is caught
by NCCL's own watchdog after ``step_timeout_s`` (torch's default handling then ends this process,
so no partial results are written); the plan broadcast and liveness checks are as on CPU. This
path has not been run on GPUs yet.
"""

from __future__ import annotations

import atexit
import dataclasses
import logging
import os
import signal
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from servelab.core.batch import StepBatch
from servelab.core.contexts import ExecutorContext
from servelab.core.executor import BackendConfig
from servelab.core.parallel_layout import check_expert_parallel, check_pipeline_parallel
from servelab.core.shapes import ModelShape
from servelab.exec.executor import Executor, ModelWorker, StepOutput, resolve_device
from servelab.core.model_spec import ModelSpec, load_spec
from servelab.core.errors import ConfigError
from servelab.exec.tp_comm import TPComm, store_key
from servelab.exec.tp_worker import rank_config, worker_main

log = logging.getLogger(__name__)


class TPWorkerError(RuntimeError):
    """A tensor-parallel worker died, hung or failed; the message names the rank."""


def check_tensor_parallel(spec: ModelSpec, size: int, device: str, model_path: str = "", ep: int = 1,
                          pp: int = 1) -> None:
    """Raise :class:`ConfigError` naming the numbers if the model cannot be split ``size`` ways (``ep`` of
    them by expert) in each of ``pp`` pipeline stages here."""
    where = f" of model {model_path!r}" if model_path else ""
    check_expert_parallel(ep, size, spec.num_experts, spec.moe_intermediate_size)
    check_pipeline_parallel(pp, spec.num_layers)
    if size < 1:
        raise ConfigError(f"tensor_parallel_size={size} must be >= 1")
    if spec.num_heads % size:
        raise ConfigError(f"tensor_parallel_size={size} does not divide num_attention_heads={spec.num_heads}{where}")
    kv = spec.num_kv_heads
    if size <= kv and kv % size:
        raise ConfigError(f"tensor_parallel_size={size} does not divide num_key_value_heads={kv}{where}")
    if size > kv and size % kv:
        raise ConfigError(f"tensor_parallel_size={size} exceeds num_key_value_heads={kv}{where} and is not a "
                          "multiple of it (each KV head is replicated on a whole number of ranks)")
    if spec.intermediate_size % size:
        raise ConfigError(f"tensor_parallel_size={size} does not divide intermediate_size={spec.intermediate_size}"
                          f"{where}")
    if resolve_device(device).type == "cuda" and size * pp > torch.cuda.device_count():
        layout = f"tensor_parallel_size={size}" + (f" x pipeline_parallel_size={pp}" if pp > 1 else "")
        raise ConfigError(f"{layout} needs {size * pp} CUDA devices (one per rank) but "
                          f"{torch.cuda.device_count()} are visible")


def default_threads_per_rank(size: int) -> int:
    """Share this process's CPU cores between the ranks (at least one thread each)."""
    return max(1, len(os.sched_getaffinity(0)) // size)


class TPExecutor(Executor):
    """``backend=tp``: the model sharded over ``context.tensor_parallel_size`` x
    ``context.pipeline_parallel_size`` processes (experts ``context.expert_parallel_size`` ways); this
    process is rank 0. ``config.tp_step_timeout_s`` bounds a wait on another rank in a step;
    ``config.num_threads`` is torch's threads per rank (null: this process's cores / ranks)."""

    name = "tp"

    def __init__(self, config: BackendConfig, context: ExecutorContext, startup_timeout_s: float = 600.0) -> None:
        super().__init__(config, context)
        cfg, tp, ep, pp = (context.worker, context.tensor_parallel_size, context.expert_parallel_size,
                           context.pipeline_parallel_size)
        step_timeout_s, num_threads = config.tp_step_timeout_s, config.num_threads
        check_tensor_parallel(load_spec(cfg.model_path), tp, cfg.device, cfg.model_path, ep, pp)
        self.size = size = tp * pp
        self.step_timeout_s = step_timeout_s
        self.procs: list[mp.Process] = []
        self.comm: TPComm | None = None
        self._seq = 0
        self._in_step = False
        self._failed = False
        self._closed = False
        threads = num_threads or default_threads_per_rank(size)
        self._saved_threads = torch.get_num_threads()
        torch.set_num_threads(threads)
        atexit.register(self.shutdown)
        try:
            self._store = dist.TCPStore("127.0.0.1", 0, size, True, timeout=timedelta(seconds=startup_timeout_s),
                                        wait_for_workers=False)
            ctx = mp.get_context("spawn")
            for rank in range(1, size):
                proc = ctx.Process(target=worker_main, name=f"servelab-tp-rank{rank}", daemon=True,
                                   args=(rank, size, cfg, self._store.port, step_timeout_s, threads, os.getpid(),
                                         tp, ep))
                proc.start()
                self.procs.append(proc)
            deadline = time.monotonic() + startup_timeout_s
            self._wait_for_workers(deadline)
            cfg0 = rank_config(cfg, 0)
            device = resolve_device(cfg0.device)
            if device.type == "cuda":
                torch.cuda.set_device(device)
            self.comm = TPComm(self._store, 0, size, device, step_timeout_s, tp, ep)
            self.worker = ModelWorker(cfg0, self.comm.tp_group(), self.comm.pipeline_stage())
            self.num_kv_blocks = self.comm.min_over_ranks(self.worker.available_kv_blocks(),
                                                          poll=lambda: self._startup_poll(deadline))
            self.worker.allocate_kv_cache(self.num_kv_blocks)
        except TPWorkerError:
            self.shutdown()
            raise
        except BaseException as exc:
            error = self._diagnose(-1, exc) if self.procs else exc
            self.shutdown()
            if error is exc:
                raise
            raise error from exc
        self.spec = self.worker.spec
        self.bytes_per_block = self.worker.bytes_per_block()  # per rank (each holds its KV heads)
        self.num_swap_blocks = self.worker.swap_pool_blocks()  # every rank allocates the same host pool
        log.info("tensor parallel: %d ranks (pids %s), %d KV blocks each, %d torch threads per rank", size,
                 [os.getpid()] + [p.pid for p in self.procs], self.num_kv_blocks, threads)

    @property
    def worker_pids(self) -> list[int]:
        """Process ids of ranks 1..N-1."""
        return [p.pid for p in self.procs]

    def draft(self, batch):
        """Rank 0 holds the draft model (if any) and drafts alone."""
        if self.worker.draft_model is None:
            return super().draft(batch)
        return self.worker.draft(batch)

    def measure_swap_bandwidth(self) -> float:
        """Rank 0's device <-> host copy bandwidth (every rank copies its own shard in parallel)."""
        return self.worker.measure_swap_bandwidth()

    @property
    def draft_shape(self) -> ModelShape | None:
        draft = self.worker.draft_model  # rank 0 runs it
        return ModelShape.from_spec(draft.spec) if draft is not None else None

    def describe(self) -> dict[str, str]:
        return {"device": str(self.worker.device), "attention": self.worker.ops.name}

    def execute(self, batch: StepBatch) -> StepOutput:
        """Broadcast ``batch`` to every rank and run rank 0's shard; raise :class:`TPWorkerError` on a fault.

        ``model_s`` is rank 0's compute time; ``comm_s`` its time in collectives (the plan broadcast
        and the forward's all-reduces/all-gathers, waiting for slower ranks included).
        """
        if self._failed or self._closed:
            raise TPWorkerError("the tensor-parallel executor already failed or was shut down")
        self._raise_if_dead(self._seq)
        seq, comm = self._seq, self.comm
        assert comm is not None  # set in __init__ (rank 0's group)
        self._in_step = True
        comm.comm_s = 0.0
        try:
            # Only rank 0 verifies drafts: the drafter's probabilities need not travel.
            comm.send_plan(seq, dataclasses.replace(batch, draft_probs=[]) if batch.draft_probs else batch)
            plan_s = comm.comm_s
            out = self.worker.execute(batch)
        except Exception as exc:
            self._failed = True
            error = self._diagnose(seq, exc)
            if error is exc:
                raise
            raise error from exc
        self._in_step = False
        self._seq += 1
        forward_comm_s = comm.comm_s - plan_s
        return StepOutput(out.sampled, max(0.0, out.model_s - forward_comm_s), comm.comm_s, out.accepted)

    def shutdown(self) -> None:
        """Stop every worker (a stop message if the group is healthy, else kill) and free the group."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self.shutdown)
        comm = self.comm
        healthy = comm is not None and not (self._failed or self._in_step) and \
            all(p.exitcode is None for p in self.procs)
        if healthy and comm is not None:
            try:
                comm.send_stop(self._seq)
            except Exception:  # noqa: BLE001 - fall through to killing
                healthy = False
        deadline = time.monotonic() + (10.0 if healthy else 0.0)
        for proc in self.procs:
            proc.join(timeout=max(0.0, deadline - time.monotonic()))
        for proc in self.procs:
            if proc.is_alive():
                proc.kill()
            proc.join(timeout=10.0)
        if self.comm is not None:
            try:
                self.comm.close()
            except Exception:
                log.warning("could not destroy the tensor-parallel process group cleanly", exc_info=True)
        torch.set_num_threads(self._saved_threads)

    # ---- faults -------------------------------------------------------------------------
    def _wait_for_workers(self, deadline: float) -> None:
        keys = [store_key("joined", r) for r in range(1, self.size)]
        while not self._store.check(keys):
            self._startup_poll(deadline)
            time.sleep(0.02)

    def _startup_poll(self, deadline: float) -> None:
        self._raise_if_dead(-1)
        if time.monotonic() > deadline:
            raise TPWorkerError("tensor-parallel workers did not start within the start-up timeout")

    def _raise_if_dead(self, seq: int) -> None:
        if any(p.exitcode is not None for p in self.procs):
            self._failed = True
            raise self._diagnose(seq, None)

    def _diagnose(self, seq: int, exc: BaseException | None) -> BaseException:
        """Name the rank behind a failed collective: a dead one, else a hung one; else ``exc`` itself."""
        when = "during start-up" if seq < 0 else f"at step {seq}"
        grace_s = 0.0 if exc is None else 0.5 if _is_timeout(exc) else 2.0
        dead = self._wait_for_dead(grace_s)
        if dead:
            parts = [f"rank {rank} (pid {p.pid}) {_exit_text(p.exitcode)}{self._reported_error(rank)}"
                     for rank, p in dead]
            return TPWorkerError(f"tensor-parallel worker {'; '.join(parts)} {when}; the run is stopped"
                                 + (f" [{type(exc).__name__}: {_first_line(exc)}]" if exc is not None else ""))
        if exc is None:
            return TPWorkerError(f"tensor-parallel workers failed {when}")
        if seq >= 0 and _is_timeout(exc):
            hung = self._hung_ranks(seq)
            return TPWorkerError(f"tensor-parallel worker rank {', '.join(map(str, hung)) or '?'} did not finish "
                                 f"step {seq} within {self.step_timeout_s:g} s (hung?); the run is stopped "
                                 f"[{type(exc).__name__}: {_first_line(exc)}]")
        return exc

    def _wait_for_dead(self, grace_s: float) -> list[tuple[int, mp.Process]]:
        """A peer's closed socket can be seen before its exit status: give the exit a moment."""
        deadline = time.monotonic() + grace_s
        while True:
            dead = [(rank, p) for rank, p in enumerate(self.procs, start=1) if p.exitcode is not None]
            if dead or time.monotonic() >= deadline:
                return dead
            time.sleep(0.05)

    def _hung_ranks(self, seq: int) -> list[int]:
        """Alive ranks that did not finish step ``seq`` and reported no error of their own."""
        lagging = []
        for rank in range(1, self.size):
            try:
                done = int(self._store.get(store_key("step", rank))) if self._store.check(
                    [store_key("step", rank)]) else -1
            except Exception:  # noqa: BLE001
                done = -1
            if done < seq and not self._store.check([store_key("error", rank)]):
                lagging.append(rank)
        return lagging

    def _reported_error(self, rank: int) -> str:
        try:
            if self._store.check([store_key("error", rank)]):
                lines = self._store.get(store_key("error", rank)).decode().strip().splitlines()
                return f": {lines[-1]}" if lines else ""
        except Exception:  # noqa: BLE001
            pass
        return ""


def _exit_text(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def _is_timeout(exc: BaseException) -> bool:
    text = str(exc).lower()
    return "timed out" in text or "timeout" in text


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0][:200] if lines else ""
