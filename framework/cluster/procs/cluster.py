"""A wall-clock cluster: one engine process per replica, the router in this (the parent) process.

What ``cluster.replicas=N`` (colocated) or ``cluster.prefill_replicas=P cluster.decode_replicas=D``
(disaggregated) does on a real backend with the wall clock (the default: ``clock=auto``). Each
replica is a child process (torch.multiprocessing, spawn) that builds its own stack from its
replica's config and runs its engine loop (:mod:`servelab.cluster.procs.engine`). The parent:

- feeds the workload's requests at their arrival times on the wall clock (open loop, or closed-loop
  clients: their next request is asked for when an end comes back), each placed by the router
  plugin, the same ``Router`` interface as the simulator's cluster, on :class:`ReplicaView` s
  made from its own counts (placed, ended) and the gauges each replica reports after its steps;
- hears each ended sequence back and writes it through the same writer and summary as the
  simulator's cluster (:func:`servelab.results.cluster_summary.cluster_summary`);
- disaggregated: places each request on a prefill replica (asked for its first token); the prefill
  process sends its prompt's KV (:mod:`servelab.kv.pd.process`) back with the prefilled
  sequence, the router picks a decode replica, and the parent forwards the continued sequence
  (:func:`servelab.cluster.simulated.continued`) with the KV to it. The transport is
  torch.multiprocessing's (each child's pipe to the parent, the parent's queue to each child): a
  tensor crosses as shared memory (its pages are mapped, only a handle is pickled), through the
  parent (which routes). The decode process measures bytes and wall time.

Every process counts time from the parent's ``time.perf_counter()`` at the start (one machine:
one monotonic clock), so arrival, token and transfer times compare. A replica that fails or dies
stops the run with one line naming it; the results of the requests that ended are written, the
rest as unfinished.
"""

from __future__ import annotations

import time
from multiprocessing import connection
from dataclasses import replace
from typing import Callable

import torch.multiprocessing as mp
from omegaconf import DictConfig, OmegaConf

from servelab.cluster.simulated import checked_route, continued, ended_at_prefill
from servelab.core.interfaces import ReplicaView, Router
from servelab.core.request import Request, Sequence
from servelab.engine.arrival_source import ArrivalSource
from servelab.kv.pd.process import KVPayload, Loaded
from servelab.results.cluster_summary import KVTransferSums
from servelab.cluster.procs.engine import children_ignore_ctrl_c, replica_main
from servelab.cluster.procs.replica import ProcReplica, ReplicaProcessError, exit_text
from servelab.results.replica_report import ReplicaReport

INF = float("inf")
POLL_S = 0.02  # the longest the parent waits for a message before it checks arrivals and the children
STARTUP_TIMEOUT_S = 600.0


class ProcessCluster:
    """Replica processes and the router; :meth:`start`, :meth:`run`, then :meth:`stop` (always)."""

    def __init__(self, pools: list[tuple[str, int, DictConfig]], make_router: Callable[[list[ReplicaView]], Router],
                 time_scale: float = 1.0) -> None:
        self.pools = pools
        self.make_router = make_router
        self.time_scale = time_scale
        self.replicas: list[ProcReplica] = []
        self.router: Router | None = None
        self.kv = KVTransferSums()
        self.request_listeners: list[Callable[[Sequence], None]] = []
        self.num_ended = 0
        self._ctx = mp.get_context("spawn")
        self._origin: dict[str, Request] = {}  # request id -> the request as it arrived (while prefilling)
        self._handed: set[str] = set()  # requests on a decode replica whose prompt a prefill replica computed
        self._t0 = 0.0

    @property
    def mixed(self) -> list[ProcReplica]:
        return [r for r in self.replicas if r.role == "mixed"]

    @property
    def prefill(self) -> list[ProcReplica]:
        return [r for r in self.replicas if r.role == "prefill"]

    @property
    def decode(self) -> list[ProcReplica]:
        return [r for r in self.replicas if r.role == "decode"]

    # ---- processes ----------------------------------------------------------------------------
    def start(self) -> None:
        """Spawn every replica's process and wait until each has built its stack; build the router."""
        for role, count, pcfg in self.pools:
            for _ in range(count):
                index = len(self.replicas)
                inbox = self._ctx.Queue()
                # each child its own pipe back: a child killed while writing cannot jam the others' messages
                conn, child_end = self._ctx.Pipe(duplex=False)
                process = self._ctx.Process(target=replica_main, name=f"servelab-replica{index}",
                                            args=(index, role, OmegaConf.to_yaml(pcfg, resolve=True), inbox, child_end))
                with children_ignore_ctrl_c():  # Ctrl-C is the parent's: the child stops when told, quietly
                    process.start()
                child_end.close()  # the child holds the only writing end: its exit reads as end-of-file here
                self.replicas.append(ProcReplica(index, role, process, inbox, conn, pcfg.tensor_parallel_size))
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while any(r.limits is None for r in self.replicas):
            if time.monotonic() > deadline:
                raise ReplicaProcessError(f"replica processes not ready after {STARTUP_TIMEOUT_S:.0f} s")
            self._receive(POLL_S * 10)
        self.router = self.make_router([r.view(True) for r in self.replicas])

    def stop(self, finish: bool = False, timeout_s: float = 60.0) -> None:
        """Ask every live replica to report and exit (``finish``: after what it holds has ended; else at
        once: the run failed or was interrupted); collect the reports; end the processes that do not exit."""
        for r in self.replicas:
            if r.process.is_alive():
                r.inbox.put(("stop",) if finish else ("abort",))
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and any(r.report is None and not r.closed for r in self.replicas):
            try:
                self._receive(POLL_S * 10)
            except ReplicaProcessError:
                pass  # already reported by the run; the other replicas' reports are still wanted
        for r in self.replicas:
            r.process.join(timeout=5)
            if r.process.is_alive():
                r.process.kill()
                r.process.join(timeout=5)

    def reports(self) -> list[ReplicaReport]:
        """Each replica's report (an empty one for a replica that died before sending it)."""
        return [r.report or ReplicaReport(num_kv_blocks=r.num_kv_blocks) for r in self.replicas]

    def live_sequences(self) -> list[Sequence]:
        """Requests placed and not ended, as the parent knows them (an interrupted run writes them unfinished)."""
        seen: dict[str, Sequence] = {}
        for r in self.replicas:
            for rid, seq in r.live.items():
                seen.setdefault(rid, seq)
        return list(seen.values())

    # ---- the loop -----------------------------------------------------------------------------
    def run(self, source: ArrivalSource, on_progress: Callable[[int], None] | None = None) -> None:
        """Feed ``source``'s requests at their times and run until every one has ended."""
        decode_max = min((r.limits.max_model_len for r in self.decode if r.limits), default=0)
        self.request_listeners.append(source.on_end)
        self._t0 = time.perf_counter()
        for r in self.replicas:
            r.inbox.put(("start", self._t0, decode_max))
        reported = 0
        try:
            while True:
                now = time.perf_counter() - self._t0
                due = source.pop_due(now)
                while due is not None:
                    self._arrive(*due)
                    due = source.pop_due(now)
                outstanding = any(r.live for r in self.replicas)
                if source.exhausted and not outstanding:
                    break
                upcoming = source.next_time()
                if upcoming == INF and not outstanding:
                    raise RuntimeError("arrivals stopped with requests left to send and none in flight")
                self._receive(min(POLL_S, max(0.0, upcoming - (time.perf_counter() - self._t0))))
                if on_progress and self.num_ended > reported:
                    on_progress(self.num_ended - reported)
                    reported = self.num_ended
        finally:
            self.request_listeners.remove(source.on_end)

    def _receive(self, wait_s: float) -> None:
        """Handle every message waiting (the first waited for up to ``wait_s``); a replica whose pipe
        closed before it reported died: raise naming it."""
        timeout = wait_s
        while True:
            open_pipes = {r.conn: r for r in self.replicas if not r.closed}
            ready = connection.wait(list(open_pipes), timeout=timeout) if open_pipes else []
            if not ready:
                break
            timeout = 0
            for ready_end in ready:
                r = open_pipes[ready_end]  # wait returns the connections it was given
                try:
                    message = r.conn.recv()
                except (EOFError, OSError):
                    r.closed = True
                    continue
                self._handle(message)
        for r in self.replicas:
            if r.closed and r.report is None:
                r.process.join(timeout=1.0)
                raise ReplicaProcessError(f"replica {r.index} ({r.role}, pid {r.process.pid}) died "
                                          f"({exit_text(r.process.exitcode)})")

    def _handle(self, message: tuple) -> None:
        kind, index = message[0], message[1]
        r = self.replicas[index]
        if kind == "gauges":
            r.gauges = (message[2], message[3], message[4])
        elif kind == "ended":
            self._ended(r, message[2])
        elif kind == "prefilled":
            self._hand_off(r, message[2], message[3])
        elif kind == "loaded":
            self._loaded(r, message[2])
        elif kind == "ready":
            r.limits = message[2]
            r.num_kv_blocks = message[3]
        elif kind == "report":
            r.report = message[2]
        elif kind == "error":
            raise ReplicaProcessError(f"replica {index} ({r.role}, pid {r.process.pid}) failed: {message[2]}")

    # ---- placement ------------------------------------------------------------------------------
    def _arrive(self, request: Request, t: float) -> None:
        if not self.prefill:
            self._send(self._route(request, self.mixed, t) or self.mixed[0], request, t, request)
            return
        if not any(d.can_hold(request) for d in self.decode):  # the decode replica rejects it, saying why
            self._send(self.decode[0], request, t, request)
            return
        p = self._route(request, self.prefill, t, tokens=request.prompt_len + 1) or self.prefill[0]
        self._origin[request.id] = request
        self._send(p, request, t, replace(request, max_tokens=1), hand_off=request.max_tokens > 1)

    def _send(self, r: ProcReplica, request: Request, t: float, sent: Request, hand_off: bool = False) -> None:
        r.place(request)
        r.live[request.id] = Sequence(request, arrival_s=t)
        r.inbox.put(("add", sent, t, hand_off))

    def _route(self, request: Request, pool: list[ProcReplica], t: float,
               tokens: int | None = None) -> ProcReplica | None:
        """The router's choice among ``pool`` (checked), or None when no replica can hold the request."""
        assert self.router is not None  # built by start()
        choice = checked_route(self.router, request, [r.view(r.can_hold(request, tokens)) for r in pool], t)
        return None if choice is None else self.replicas[choice]

    # ---- what comes back ------------------------------------------------------------------------
    def _ended(self, r: ProcReplica, seq: Sequence) -> None:
        assert self.router is not None
        r.live.pop(seq.id, None)
        if r.role == "prefill":  # rejected, or stopped at its first token: the record is the prefill's
            request = self._origin.pop(seq.id)
            r.count_end(request, seq)
            seq = ended_at_prefill(seq, request)
        else:
            handed = seq.id in self._handed  # its prompt was computed and counted on a prefill replica
            self._handed.discard(seq.id)
            r.count_end(seq.request, seq, handed_on=handed)
        self.router.on_finish(seq.request, r.index)
        self.num_ended += 1
        for listener in self.request_listeners:
            listener(seq)

    def _hand_off(self, p: ProcReplica, pseq: Sequence, payload: KVPayload) -> None:
        """Prefill replica ``p`` computed ``pseq``'s prompt and first token: route its continuation
        to a decode replica, with the prompt's KV."""
        assert self.router is not None and pseq.finish_time is not None
        request = self._origin.pop(pseq.id)
        p.live.pop(pseq.id, None)
        p.end(request)
        p.prompt_tokens += request.prompt_len
        p.cached_prompt_tokens += pseq.num_cached_prompt_tokens
        p.output_tokens += pseq.num_output_tokens
        self.router.on_finish(request, p.index)
        d = self._route(request, self.decode, pseq.finish_time)
        if d is None:  # cannot happen after the arrival's check
            raise RuntimeError(f"no decode replica can hold request {request.id!r}")
        dseq = continued(pseq, request)
        d.place(request)
        d.live[request.id] = dseq
        self._handed.add(request.id)
        d.inbox.put(("seq", dseq, payload))

    def _loaded(self, d: ProcReplica, loaded: Loaded) -> None:
        request = d.live[loaded.request_id].request
        self.kv.num_kv_transfers += 1
        self.kv.kv_transfer_bytes += loaded.nbytes
        self.kv.kv_transfer_s += loaded.transfer_s
        self.kv.kv_transfer_exposed_s += loaded.exposed_s
        d.prompt_tokens += request.prompt_len
        d.cached_prompt_tokens += loaded.cached_tokens
