"""A wall-clock cluster: one engine process per replica, the router in this (the parent) process.

What ``cluster.replicas=N`` (colocated) or ``cluster.prefill_replicas=P cluster.decode_replicas=D``
(disaggregated) does on a real backend with the wall clock (the default: ``clock=auto``). Each
replica is a child process (torch.multiprocessing, spawn) that builds its own stack from its
replica's config and runs its engine loop (:mod:`servelab.cluster.procs.engine`). The parent:

- drives the cluster protocol (:mod:`servelab.cluster.protocol`) as the simulator's loop does:
  feeds the workload's requests at their arrival times on the wall clock (open loop, or closed-loop
  clients: their next request is asked for when an end comes back), each placed by the router
  plugin on :class:`ReplicaView` s made from its own counts (placed, ended) and the gauges each
  replica reports after its steps;
- hears each ended sequence back and writes it through the same writer and summary as the
  simulator's cluster (:func:`servelab.results.cluster_summary.cluster_summary`);
- colocated with a migration policy that moves requests: asks it on the loads the replicas report and
  relays each live migration's messages and KV between the processes
  (:mod:`servelab.cluster.procs.migration`);
- disaggregated: places each request on a prefill replica (asked for its first token); the prefill
  process sends its prompt's KV (:mod:`servelab.kv.pd.process`) back with the prefilled
  sequence, the router picks a decode replica (the protocol's hand-off), and the parent forwards the
  continued sequence with the KV to it. The transport is
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
from typing import Callable

import torch.multiprocessing as mp
from omegaconf import DictConfig, OmegaConf

from servelab.cluster.protocol import ClusterProtocol
from servelab.core.interfaces import ReplicaView, Router
from servelab.core.request import Request, Sequence
from servelab.engine.arrival_source import ArrivalSource
from servelab.kv.pd.process import KVPayload, Loaded
from servelab.cluster.migration import MigrationSettings
from servelab.core.migration_policy import MigrationPolicy
from servelab.cluster.procs.migration import ProcMigrationDriver
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
                 time_scale: float = 1.0, migration_policy: MigrationPolicy | None = None,
                 migration_settings: MigrationSettings | None = None) -> None:
        self.pools = pools
        self.make_router = make_router
        self.time_scale = time_scale
        # a policy that moves requests: the replicas send and take them (servelab.cluster.procs.migration)
        self.migration_policy = migration_policy if migration_policy is not None and type(
            migration_policy).moves_requests else None
        self.migration_settings = migration_settings or MigrationSettings()
        self.migration: ProcMigrationDriver | None = None  # once every replica is ready (start)
        self.replicas: list[ProcReplica] = []
        self.protocol: ClusterProtocol[ProcReplica] | None = None  # once every replica is ready (start)
        self.kv = KVTransferSums()
        self.request_listeners: list[Callable[[Sequence], None]] = []
        self.num_ended = 0
        self._ctx = mp.get_context("spawn")
        self.t0 = 0.0

    @property
    def router(self) -> Router | None:
        return self.protocol.router if self.protocol is not None else None

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
                                            args=(index, role, OmegaConf.to_yaml(pcfg, resolve=True), inbox, child_end,
                                                  self.migration_policy is not None))
                with children_ignore_ctrl_c():  # Ctrl-C is the parent's: the child stops when told, quietly
                    process.start()
                child_end.close()  # the child holds the only writing end: its exit reads as end-of-file here
                self.replicas.append(ProcReplica(index, process, inbox, conn, role=role,
                                                 tensor_parallel_size=pcfg.tensor_parallel_size))
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while any(r.limits is None for r in self.replicas):
            if time.monotonic() > deadline:
                raise ReplicaProcessError(f"replica processes not ready after {STARTUP_TIMEOUT_S:.0f} s")
            self._receive(POLL_S * 10)
        self.protocol = ClusterProtocol(self.replicas, self.make_router([r.view(True) for r in self.replicas]))
        if self.migration_policy is not None:
            self.migration = ProcMigrationDriver(self, self.migration_policy, self.migration_settings)

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
        placements = self.protocol.placements.values() if self.protocol is not None else ()
        return [p.seq for p in placements if p.seq is not None]

    # ---- the loop -----------------------------------------------------------------------------
    def run(self, source: ArrivalSource, on_progress: Callable[[int], None] | None = None) -> None:
        """Feed ``source``'s requests at their times and run until every one has ended."""
        assert self.protocol is not None  # built by start()
        placements = self.protocol.placements
        self.request_listeners.append(source.on_end)
        self.t0 = time.perf_counter()
        for r in self.replicas:
            r.inbox.put(("start", self.t0, self.protocol.decode_max_model_len))
        reported = 0
        try:
            while True:
                now = time.perf_counter() - self.t0
                if self.migration is not None:  # before the arrivals: one at drain_from_s avoids a draining replica
                    self.migration.tick(now)
                due = source.pop_due(now)
                while due is not None:
                    self._arrive(*due)
                    due = source.pop_due(now)
                outstanding = bool(placements)
                if source.exhausted and not outstanding:
                    break
                upcoming = source.next_time()
                if upcoming == INF and not outstanding:
                    raise RuntimeError("arrivals stopped with requests left to send and none in flight")
                self._receive(min(POLL_S, max(0.0, upcoming - (time.perf_counter() - self.t0))))
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
            r.gauges = message[2]
            if len(message) > 3:  # the per-request loads of a cluster that migrates
                r.load = message[3]
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
        elif kind.startswith("mig_"):
            self._migration_message(r, kind, message[2:])
        elif kind == "error":
            raise ReplicaProcessError(f"replica {index} ({r.role}, pid {r.process.pid}) failed: {message[2]}")

    def _migration_message(self, r: ProcReplica, kind: str, args: tuple) -> None:
        driver = self.migration
        assert driver is not None, f"replica {r.index} sent {kind!r} in a cluster that does not migrate"
        if kind == "mig_kv":
            driver.kv(r, *args)
        elif kind == "mig_held":
            driver.held(r, *args)
        elif kind == "mig_stopped":
            driver.stopped(r, *args)
        elif kind == "mig_landed":
            driver.landed(r, *args)

    # ---- placement: the protocol decides, the parent sends --------------------------------------
    def _arrive(self, request: Request, t: float) -> None:
        assert self.protocol is not None
        r, asked = self.protocol.arrive(request, t)
        self.protocol.placements[request.id].seq = Sequence(request, arrival_s=t)  # what the parent knows of it
        r.inbox.put(("add", asked, t, asked.max_tokens < request.max_tokens))  # a prefill it hands on

    # ---- what comes back ------------------------------------------------------------------------
    def _ended(self, r: ProcReplica, seq: Sequence) -> None:
        assert self.protocol is not None
        if r.role == "prefill":  # rejected, or stopped at its first token: the record is the prefill's
            final = self.protocol.prefill_ended(r, seq, continues=False)
            assert final is not None
        else:
            if self.migration is not None:
                self.migration.ended(r, seq.id)
            final = self.protocol.ended(r, seq)
            self.protocol.finished(final.request, r.index)
        self.num_ended += 1
        for listener in self.request_listeners:
            listener(final)

    def _hand_off(self, p: ProcReplica, pseq: Sequence, payload: KVPayload) -> None:
        """Prefill replica ``p`` computed ``pseq``'s prompt and first token: its continuation goes to
        the decode replica the protocol's hand-off picks, with the prompt's KV."""
        assert self.protocol is not None and pseq.finish_time is not None
        self.protocol.prefill_ended(p, pseq, continues=True)
        d, dseq = self.protocol.hand_off(pseq, pseq.finish_time)
        d.inbox.put(("seq", dseq, payload))

    def _loaded(self, d: ProcReplica, loaded: Loaded) -> None:
        assert self.protocol is not None
        request = self.protocol.placements[loaded.request_id].request
        self.kv.num_kv_transfers += 1
        self.kv.kv_transfer_bytes += loaded.nbytes
        self.kv.kv_transfer_s += loaded.transfer_s
        self.kv.kv_transfer_exposed_s += loaded.exposed_s
        self.protocol.prompt_received(d, request, loaded.cached_tokens)
