"""The tensor-parallel wire: process groups, the model's collectives, and the per-step plan broadcast.

Every rank (rank 0 = the engine process, ranks 1.. = spawned workers) builds one :class:`TPComm`.
All traffic goes through torch.distributed:

* ``control`` (gloo, long timeout): the fixed-size step header and the start-up all-reduce of the
  KV pool size. Workers idle here between steps, for as long as the engine waits for arrivals, so
  the group's timeout must not bound a step: rank 0 waits on the header with ``step_timeout_s``.
* ``plan`` (gloo, ``step_timeout_s``): the rest of the plan (one packed int64 tensor, float tensors
  if any, the pickled small metadata).
* ``model`` (nccl on CUDA, else the ``plan`` group): the all-reduce / all-gather inside the forward,
  one group per pipeline stage (its ``tp`` ranks).
* pipeline stages (``size = tp x stages``; rank ``r`` is stage ``r // tp``, tensor-parallel rank ``r % tp``):
  each rank sends its hidden states to the same tensor-parallel rank of the next stage, and the last
  stage's first rank sends the sampled rows' logits to rank 0, point to point over the ``plan`` group.

So every wait that can block rank 0 during a step is bounded by ``step_timeout_s``.
"""

from __future__ import annotations

import dataclasses
import pickle
import time
from datetime import timedelta
from typing import Callable

import numpy as np
import torch
import torch.distributed as dist

from servelab.core.batch import StepBatch
from servelab.exec.model.layers import PipelineStage, TPGroup

OP_STEP, OP_STOP = 1, 2
IDLE_TIMEOUT = timedelta(days=7)
STORE_PREFIX = "servelab/tp/"


def store_key(kind: str, rank: int) -> str:
    """Keys rank 0 reads to explain a failure: ``joined``, ``error`` (a traceback), ``step`` (heartbeat)."""
    return f"{STORE_PREFIX}{kind}/{rank}"


class TPComm:
    """This rank's process groups and collectives; ``comm_s`` accumulates time spent in them."""

    def __init__(self, store: dist.Store, rank: int, size: int, device: torch.device, step_timeout_s: float,
                 tp: int | None = None, ep: int = 1) -> None:
        """``size`` ranks in all: pipeline stages of ``tp`` ranks each (None: one stage of all of them);
        ``ep``: how many ways a MoE layer splits its experts over a stage's ranks."""
        if dist.is_initialized():
            raise RuntimeError("a torch.distributed process group already exists in this process; "
                               "only one tensor-parallel executor can run per process")
        self.rank, self.size, self.device = rank, size, device
        self.tp, self.ep = tp or size, ep
        self.num_stages, self.stage_index = size // self.tp, rank // self.tp
        dist.init_process_group("gloo", store=store, rank=rank, world_size=size, timeout=IDLE_TIMEOUT)
        self.control = dist.group.WORLD
        self.step_timeout = timedelta(seconds=step_timeout_s)
        self.plan = dist.new_group(backend="gloo", timeout=self.step_timeout)
        backend = "nccl" if device.type == "cuda" else "gloo"
        if self.num_stages == 1:
            self.model = dist.new_group(backend="nccl", timeout=self.step_timeout) if backend == "nccl" else self.plan
        else:  # every rank creates every stage's group, in the same order
            groups = [dist.new_group(list(range(s * self.tp, (s + 1) * self.tp)), backend=backend,
                                     timeout=self.step_timeout) for s in range(self.num_stages)]
            self.model = groups[self.stage_index]
        self.comm_s = 0.0

    def tp_group(self) -> TPGroup:
        """The collectives the model layers call (timed; on CUDA only the launch is timed)."""
        if self.tp == 1:
            return TPGroup(ep_size=self.ep)
        return TPGroup(self.rank % self.tp, self.tp, self.all_reduce, self.all_gather_last_dim, self.ep)

    def pipeline_stage(self) -> PipelineStage:
        """This rank's pipeline stage and its links."""
        if self.num_stages == 1:
            return PipelineStage()
        return PipelineStage(self.stage_index, self.num_stages, send=lambda t: self._send(t, self.rank + self.tp),
                             recv=lambda shape, dtype: self._recv(shape, dtype, self.rank - self.tp),
                             send_logits=lambda t: self._send(t, 0),
                             recv_logits=lambda shape, dtype: self._recv(shape, dtype, (self.num_stages - 1) * self.tp))

    def _send(self, t: torch.Tensor, dst: int) -> None:
        start = time.perf_counter()
        dist.send(t.contiguous().cpu(), dst, group=self.plan)
        self.comm_s += time.perf_counter() - start

    def _recv(self, shape: tuple[int, ...], dtype: torch.dtype, src: int) -> torch.Tensor:
        start = time.perf_counter()
        out = torch.empty(shape, dtype=dtype)
        dist.recv(out, src, group=self.plan)
        self.comm_s += time.perf_counter() - start
        return out.to(self.device)

    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        start = time.perf_counter()
        dist.all_reduce(t, group=self.model)
        self.comm_s += time.perf_counter() - start
        return t

    def all_gather_last_dim(self, t: torch.Tensor) -> torch.Tensor:
        start = time.perf_counter()
        t = t.contiguous()
        parts = [torch.empty_like(t) for _ in range(self.tp)]
        dist.all_gather(parts, t, group=self.model)
        out = torch.cat(parts, dim=-1)
        self.comm_s += time.perf_counter() - start
        return out

    def min_over_ranks(self, value: int, poll: Callable[[], None] | None = None) -> int:
        """All-reduce MIN of an int over the ``control`` group (start-up: no step timeout applies).

        With ``poll``, wait asynchronously and call ``poll()`` until done; it may raise to give up.
        """
        t = torch.tensor([value], dtype=torch.int64)
        work = dist.all_reduce(t, op=dist.ReduceOp.MIN, group=self.control, async_op=True)
        while poll is not None and not work.is_completed():
            poll()
            time.sleep(0.02)
        work.wait()
        return int(t.item())

    # ---- the plan -----------------------------------------------------------------------
    def send_plan(self, seq: int, batch: StepBatch) -> None:
        """Rank 0: broadcast step ``seq``'s batch to every rank (header, ints, floats, metadata)."""
        start = time.perf_counter()
        ints, floats, meta = pack_batch(batch)
        blob = torch.frombuffer(bytearray(pickle.dumps(meta)), dtype=torch.uint8)
        self._send_header([seq, OP_STEP, ints.numel(), blob.numel()])
        dist.broadcast(ints, src=0, group=self.plan)
        dist.broadcast(blob, src=0, group=self.plan)
        for t in floats:
            dist.broadcast(t, src=0, group=self.plan)
        self.comm_s += time.perf_counter() - start

    def send_stop(self, seq: int) -> None:
        self._send_header([seq, OP_STOP, 0, 0])

    def _send_header(self, values: list[int]) -> None:
        # gloo's broadcast waits for every receiver to post its receive: bound the wait here, since
        # the control group's own timeout is the (long) idle one.
        work = dist.broadcast(torch.tensor(values, dtype=torch.int64), src=0, group=self.control, async_op=True)
        work.wait(timeout=self.step_timeout)

    def receive_plan(self) -> tuple[int, StepBatch | None]:
        """Workers: block until rank 0 sends the next plan; ``(seq, None)`` means stop."""
        header = torch.zeros(4, dtype=torch.int64)
        dist.broadcast(header, src=0, group=self.control)
        seq, op, num_ints, num_bytes = header.tolist()
        if op == OP_STOP:
            return seq, None
        ints = torch.empty(num_ints, dtype=torch.int64)
        dist.broadcast(ints, src=0, group=self.plan)
        blob = torch.empty(num_bytes, dtype=torch.uint8)
        dist.broadcast(blob, src=0, group=self.plan)
        meta = pickle.loads(blob.numpy().tobytes())
        floats = [torch.empty(shape, dtype=dtype) for _, shape, dtype in meta["float_specs"]]
        for t in floats:
            dist.broadcast(t, src=0, group=self.plan)
        return seq, unpack_batch(ints, floats, meta)

    def close(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()


def pack_batch(batch: StepBatch) -> tuple[torch.Tensor, list[torch.Tensor], dict]:
    """Split a batch into one int64 tensor (every integer tensor field), float tensors, and the rest.

    Generic over :class:`StepBatch`'s fields, so a field added later travels without a change here.
    """
    ints, floats = [], []
    meta: dict = {"int_specs": [], "float_specs": [], "values": {}}
    for f in dataclasses.fields(batch):
        value = getattr(batch, f.name)
        if isinstance(value, np.ndarray):  # the engine builds batches with numpy arrays
            value = torch.from_numpy(value)
        if isinstance(value, torch.Tensor) and not value.is_floating_point():
            meta["int_specs"].append((f.name, tuple(value.shape), value.dtype))
            ints.append(value.reshape(-1).to(torch.int64))
        elif isinstance(value, torch.Tensor):
            meta["float_specs"].append((f.name, tuple(value.shape), value.dtype))
            floats.append(value.contiguous().cpu())
        else:
            meta["values"][f.name] = value
    packed = torch.cat(ints) if ints else torch.zeros(0, dtype=torch.int64)
    return packed.cpu(), floats, meta


def unpack_batch(ints: torch.Tensor, floats: list[torch.Tensor], meta: dict) -> StepBatch:
    """Inverse of :func:`pack_batch`."""
    fields = dict(meta["values"])
    offset = 0
    for name, shape, dtype in meta["int_specs"]:
        n = int(torch.Size(shape).numel())
        fields[name] = ints[offset:offset + n].reshape(shape).to(dtype)
        offset += n
    for (name, _, _), tensor in zip(meta["float_specs"], floats):
        fields[name] = tensor
    return StepBatch(**fields)
