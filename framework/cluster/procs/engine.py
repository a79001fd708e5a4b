"""One engine process of a wall-clock cluster (:mod:`servelab.cluster.procs.cluster`): the child's side.

The child builds its own stack from its replica's config (a pool's config for prefill/decode),
says it is ready (its limits), waits for the run's start time, then loops: take what the parent
sent (requests to admit, handed-off sequences with their prompt KV, stop), step the engine, and
send back what happened (gauges after each step, each ended sequence, each prefilled sequence
with its KV, each landed transfer). At ``stop`` it sends its :class:`ReplicaReport` and exits. Any
error is sent as one line naming the replica before the process exits. Ctrl-C is the parent's to
answer: the child ignores SIGINT and reports and exits when the parent says ``abort``.

Messages, parent -> child: ``("start", t0, decode_max_model_len)``, ``("add", request, arrival_s, hand_off)``,
``("seq", seq, payload)``, ``("stop",)`` (finish what it holds, then report) and ``("abort",)``
(report now: the run failed or was interrupted). Child -> parent: ``("ready", i, limits, num_kv_blocks)``,
``("gauges", i, Gauges)`` (``("gauges", i, Gauges, ReplicaLoad)`` when the cluster migrates: the
per-request loads a migration policy sees), ``("ended", i, seq)``,
``("prefilled", i, seq, payload)``, ``("loaded", i, Loaded)``, ``("report", i, report)``,
``("error", i, line)``, each on the child's own pipe. ``t0`` is the parent's ``time.perf_counter()`` at the start: every engine's
clock counts from it, so the processes' timestamps compare (one machine, one monotonic clock).
A live migration's messages (``mig_*``) are :mod:`servelab.cluster.procs.migrate_child`'s.
"""

from __future__ import annotations

import contextlib
import queue
import signal
import threading
from pathlib import Path
from typing import Any, Iterator, cast

from omegaconf import DictConfig, OmegaConf, open_dict

from servelab.cluster.protocol import Gauges, continues_after_prefill
from servelab.core.kinds import KINDS
from servelab.core.registry import default_registry
from servelab.core.request import Sequence
from servelab.core.contexts import KVClusterLink
from servelab.kv.connectors import find_part
from servelab.kv.pd.process import KVPayload, ProcessKVConnector, ProcessLink
from servelab.kv.migrate_proc import ProcessMigrationConnector
from servelab.cluster.migration import engine_load
from servelab.cluster.procs.migrate_child import MigrationEndpoint
from servelab.config import plugin_node, schema
from servelab.results.replica_report import ReplicaReport
from servelab.assemble.stack import build_stack

IDLE_WAIT_S = 0.05  # how long an idle engine waits for the parent's next message


@contextlib.contextmanager
def children_ignore_ctrl_c() -> Iterator[None]:
    """While the parent spawns the replicas: SIGINT ignored, so each child starts ignoring it (an ignored
    signal stays ignored across exec, and Python then installs no KeyboardInterrupt handler). Ctrl-C
    reaches the whole process group; the parent alone answers it (one line, partial results) and tells
    each replica to report and exit, so no child prints a traceback of its own. Off the main thread
    (where no handler can be set) nothing changes."""
    previous = _ignore_ctrl_c()
    try:
        yield
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)


def _ignore_ctrl_c() -> Any:
    """Ignore SIGINT in this process (on its main thread: elsewhere no handler can be set); the handler
    it had, or None where nothing changed."""
    if threading.current_thread() is not threading.main_thread():
        return None
    return signal.signal(signal.SIGINT, signal.SIG_IGN)


def replica_main(index: int, role: str, config_yaml: str, inbox: Any, outbox: Any, migrates: bool = False) -> None:
    """The target of replica ``index``'s process (``role``: mixed, prefill or decode; ``config_yaml``: its
    resolved config, as text: the composed config's schema class is made at run time and does not pickle;
    ``migrates``: the cluster's migration policy moves requests, so this replica sends and takes them,
    :mod:`servelab.cluster.procs.migrate_child`).
    Ctrl-C is the parent's to answer (:func:`children_ignore_ctrl_c`): ignored here too, whoever started it."""
    _ignore_ctrl_c()
    try:
        _serve(index, role, typed_config(config_yaml), inbox, outbox, migrates)
    except Exception as exc:  # noqa: BLE001 - told to the parent as one line; it stops the run naming this replica
        try:
            outbox.send(("error", index, f"{type(exc).__name__}: {exc}".splitlines()[0]))
        except OSError:  # the parent is gone: nobody to tell
            pass
        raise SystemExit(1) from None


def typed_config(config_yaml: str) -> DictConfig:
    """A resolved config sent as text, typed again as ``compose`` types it: the schema, each engine
    plugin group as its plugin's ``Config`` (plugins take typed configs; enums stay enums). The
    plugins are the installed ones (entry points): a plugin registered only in the parent's
    registry is not known here."""
    plain = cast(DictConfig, OmegaConf.create(config_yaml))  # a config is a mapping
    registry = default_registry()
    nodes = {k.group: plugin_node(registry.get(k.name, plain[k.group].name)) for k in KINDS.values()
             if k.group in plain and k.scope != "cluster"}  # the router runs in the parent
    return cast(DictConfig, OmegaConf.merge(OmegaConf.structured(schema()), nodes, plain))


def _serve(index: int, role: str, cfg: DictConfig, inbox: Any, outbox: Any, migrates: bool = False) -> None:
    hand_off: set[str] = set()  # prefill side: requests that go on to a decode replica after their first token
    decode_max_len = [0]

    def send(seq: Sequence, payload: KVPayload) -> None:
        hand_off.discard(seq.id)
        outbox.send(("prefilled", index, seq, payload))

    link = KVClusterLink(index, role)
    if role != "mixed":  # kv_connector=pd_process, built through the kinds table beside any tiers
        link = KVClusterLink(index, role, ProcessLink(
            send, should_send=lambda seq: continues_after_prefill(seq, seq.id in hand_off, decode_max_len[0]),
            on_loaded=lambda loaded: outbox.send(("loaded", index, loaded))), "pd_process")
    _own_disk_dir(cfg, index)
    moves = ProcessMigrationConnector() if migrates and role == "mixed" else None  # asked before any other
    stack = build_stack(cfg, cluster=link, connector=moves)
    engine = stack.engine
    connector = find_part(engine.connector, ProcessKVConnector)
    endpoint = None
    if moves is not None:
        moves.bind(stack.executor)
        endpoint = MigrationEndpoint(index, engine, moves, outbox)
    engine.keep_steps = bool(cfg.debug.log_steps)
    engine.forget_ended = True

    def ended(seq: Sequence) -> None:
        if connector is not None and connector.keeps(seq.id):
            return  # its KV goes on: the parent hears of it as "prefilled", with the KV, after the step
        if endpoint is not None and endpoint.silenced(seq):
            return  # stopped for a migration: it goes on elsewhere
        hand_off.discard(seq.id)
        outbox.send(("ended", index, seq))

    engine.end_listeners.append(ended)
    outbox.send(("ready", index, stack.limits, engine.allocator.num_blocks))
    stopping = False
    try:
        while True:
            message = inbox.get()
            if message[0] == "start":
                engine.reset_clock(origin=message[1])
                decode_max_len[0] = message[2]
                break
            if message[0] in ("stop", "abort"):
                return
        while not (stopping and not engine.has_unfinished()):
            said = _take(inbox, engine, connector, hand_off, endpoint, wait=not engine.has_unfinished())
            if said == "abort":
                return
            stopping = stopping or said == "stop"
            if engine.has_unfinished():
                if engine.step() is None:
                    said = _take(inbox, engine, connector, hand_off, endpoint, wait=True)
                    if said == "abort":
                        return
                    stopping = stopping or said == "stop"
                else:
                    engine.poll_connector()  # blocks whose KV this step read out go back now, not at the next step
                    outbox.send(("gauges", index, Gauges.of(engine))
                                if endpoint is None else ("gauges", index, Gauges.of(engine), engine_load(engine, index)))
    finally:
        engine.poll_connector()
        live = any(not s.is_finished for s in engine.sequences.values())
        outbox.send(("report", index, ReplicaReport.of(stack, live)))
        stack.executor.shutdown()


def _own_disk_dir(cfg: DictConfig, index: int) -> None:
    """A disk tier named by ``kv_tiers.disk_dir`` gets a folder per replica (``replica<i>``): each
    engine process holds its own tiers, and two processes must not map the same tier file."""
    node = cfg.get("kv_tiers")
    if node is not None and node.get("disk_dir"):
        with open_dict(node):
            node.disk_dir = str(Path(node.disk_dir) / f"replica{index}")


def _take(inbox: Any, engine, connector: ProcessKVConnector | None, hand_off: set[str],
          endpoint: MigrationEndpoint | None, wait: bool) -> str | None:
    """Apply every message waiting (the first one waited for up to :data:`IDLE_WAIT_S` when ``wait``);
    ``"stop"`` or ``"abort"`` when one says so (else None)."""
    stop: str | None = None
    block = wait
    while True:
        try:
            message = inbox.get(timeout=IDLE_WAIT_S) if block else inbox.get_nowait()
        except queue.Empty:
            return stop
        block = False
        kind = message[0]
        if kind == "add":
            request, arrival_s, goes_on = message[1], message[2], message[3]
            if goes_on:
                hand_off.add(request.id)
            engine.add_request(request, arrival_s)
        elif kind == "seq":
            seq, payload = message[1], message[2]
            assert connector is not None, "a handed-off sequence goes to a decode replica"
            connector.receive(seq.id, payload)
            engine.add_sequence(seq)
        elif kind in ("stop", "abort"):
            stop = stop if stop == "abort" else kind
        elif endpoint is not None:
            endpoint.handle(message)  # a migration's (servelab.cluster.procs.migrate_child)
