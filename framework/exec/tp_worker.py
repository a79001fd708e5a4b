"""The body of a tensor-parallel worker process (ranks 1..N-1), started by :class:`~servelab.exec.tp.TPExecutor`.

A worker loads its shard, agrees on the KV pool size, then runs every plan rank 0 broadcasts until
told to stop. Any failure is written to the store (so rank 0 can name it) and ends the process.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import threading
import time
import traceback
from datetime import timedelta

import torch
import torch.distributed as dist

from servelab.exec.executor import ModelWorker, WorkerConfig, resolve_device
from servelab.exec.tp_comm import TPComm, store_key

STORE_CONNECT_TIMEOUT = timedelta(seconds=60)


def rank_config(cfg: WorkerConfig, rank: int) -> WorkerConfig:
    """One GPU per rank: rank r runs on ``cuda:r``; CPU ranks share the CPU. A draft model runs
    on rank 0 only (drafting is rank 0's business)."""
    if rank > 0:
        cfg = dataclasses.replace(cfg, draft_model_path=None, draft_scratch_blocks=0)
    if resolve_device(cfg.device).type == "cuda":
        return dataclasses.replace(cfg, device=f"cuda:{rank}")
    return dataclasses.replace(cfg, device="cpu")


def worker_main(rank: int, size: int, cfg: WorkerConfig, port: int, step_timeout_s: float,
                num_threads: int, parent_pid: int, tp: int | None = None, ep: int = 1) -> None:
    """Entry point of a spawned worker (must stay a module-level function: spawn pickles it)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is rank 0's to handle; it stops us
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    torch.set_num_threads(num_threads)
    _exit_when_orphaned(parent_pid)
    store = dist.TCPStore("127.0.0.1", port, size, False, timeout=STORE_CONNECT_TIMEOUT)
    try:
        cfg = rank_config(cfg, rank)
        device = resolve_device(cfg.device)
        if device.type == "cuda":
            torch.cuda.set_device(device)
        store.set(store_key("joined", rank), str(os.getpid()))
        comm = TPComm(store, rank, size, device, step_timeout_s, tp, ep)
        worker = ModelWorker(cfg, comm.tp_group(), comm.pipeline_stage())
        worker.allocate_kv_cache(comm.min_over_ranks(worker.available_kv_blocks()))
        expected = 0
        while True:
            seq, batch = comm.receive_plan()
            if batch is None:
                break
            if seq != expected:
                raise RuntimeError(f"rank {rank} received plan {seq} but expected plan {expected}")
            worker.execute(batch)
            store.set(store_key("step", rank), str(seq))
            expected += 1
        comm.close()
    except BaseException:  # noqa: BLE001 - report anything, then die
        try:
            store.set(store_key("error", rank), traceback.format_exc())
        finally:
            os._exit(1)  # skip destructors that could block on a broken process group


def _exit_when_orphaned(parent_pid: int) -> None:
    """Never outlive the engine process, even if it was killed with SIGKILL."""
    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, name="servelab-tp-parent-watch", daemon=True).start()
