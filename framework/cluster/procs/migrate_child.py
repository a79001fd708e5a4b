"""An engine process's side of live migration (:mod:`servelab.cluster.procs.migration` is the parent's).

Each message is handled between two steps of the engine (:mod:`servelab.cluster.procs.engine`);
a reply goes on the child's pipe to the parent. Parent -> child, then the reply:

- ``("mig_read", request_id, start, stop)`` to the source: the KV of the request's computed tokens
  from ``start`` (:meth:`ProcessMigrationConnector.read`) while it keeps running; with ``stop`` the
  request then ends here (``Engine.abort``, its end not reported as one: it goes on elsewhere) and is
  forgotten (it may come back). Reply ``("mig_kv", i, request_id, start, payload, None)``, with
  ``stop`` ``("mig_stopped", i, request_id, seq, start, payload, stop_at)``; ``("mig_kv", i,
  request_id, start, None, reason)`` when it cannot (``finished``: it ended or is not here;
  ``preempted``: it is not decoding, or its KV was dropped below ``start``).
- ``("mig_hold", request, start, payload, reserve_tokens)`` to the target: keep the stage's KV in
  host memory and hold blocks for ``reserve_tokens`` tokens in the allocator under a shadow id
  (the pool and the policy's views count them). Reply ``("mig_held", i, request_id, ok)``; not ok
  (the pool has no room) drops what it held.
- ``("mig_seq", seq, start, payload)`` to the target: the last stage and the continued sequence:
  the shadow's blocks go, the whole KV is given to the connector and the sequence to the engine;
  once written, ``("mig_landed", i, request_id, at)`` (``at``: ``time.perf_counter``).
- ``("mig_drop", request_id)`` to the target: the migration was aborted; free what it held.

After each, the child sends its gauges and loads again (``("gauges", i, Gauges, ReplicaLoad)``): its
pool changed between two steps. ``stop_at`` and ``at`` are ``time.perf_counter()`` values: one
machine, one monotonic clock.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from servelab.cluster.migration import SHADOW, decoding, engine_load
from servelab.cluster.protocol import Gauges
from servelab.core.request import Request, Sequence
from servelab.kv.migrate_proc import ProcessMigrationConnector, Received


class MigrationEndpoint:
    """One engine process's migrations: the requests it is stopping (their end is not reported) and
    what it holds for requests coming in."""

    def __init__(self, index: int, engine, connector: ProcessMigrationConnector, outbox: Any) -> None:
        self.index = index
        self.engine = engine
        self.connector = connector
        self.outbox = outbox
        self.stopping: set[str] = set()
        self.incoming: dict[str, tuple[Sequence, Received]] = {}  # request id -> (shadow, KV so far)
        connector.on_landed = lambda request_id, at: outbox.send(("mig_landed", index, request_id, at))

    def silenced(self, seq: Sequence) -> bool:
        """Whether ``seq``'s end is its stop for a migration (not reported as an end)."""
        return seq.id in self.stopping

    def handle(self, message: tuple) -> bool:
        """Apply ``message`` if it is a migration's; whether it was."""
        kind = message[0]
        if kind == "mig_read":
            self._read(*message[1:])
        elif kind == "mig_hold":
            self._hold(*message[1:])
        elif kind == "mig_seq":
            self._land(*message[1:])
        elif kind == "mig_drop":
            self._drop(message[1])
        else:
            return False
        # its pool changed between steps (blocks held, freed, a request gone): the parent's views follow now
        self.outbox.send(("gauges", self.index, Gauges.of(self.engine), engine_load(self.engine, self.index)))
        return True

    # ---- source -------------------------------------------------------------------------------
    def _read(self, request_id: str, start: int, stop: bool) -> None:
        engine = self.engine
        seq = engine.sequences.get(request_id)
        if seq is None or seq.is_finished:
            return self.outbox.send(("mig_kv", self.index, request_id, start, None, "finished"))
        if not decoding(seq) or seq.num_computed_tokens < start:
            return self.outbox.send(("mig_kv", self.index, request_id, start, None, "preempted"))
        read_at = time.perf_counter()
        payload = self.connector.read(engine.allocator.block_table(request_id), start, seq.num_computed_tokens,
                                      read_at)
        if not stop:
            return self.outbox.send(("mig_kv", self.index, request_id, start, payload, None))
        self.stopping.add(request_id)
        try:
            engine.abort(request_id)  # its blocks go back: the bytes are in the payload
            engine.forget(request_id)
        finally:
            self.stopping.discard(request_id)
        self.outbox.send(("mig_stopped", self.index, request_id, seq, start, payload, read_at))

    # ---- target -------------------------------------------------------------------------------
    def _hold(self, request: Request, start: int, payload, reserve_tokens: int) -> None:
        request_id = request.id
        held = self.incoming.get(request_id)
        if held is None:
            shadow = Sequence(dataclasses.replace(request, id=request_id + SHADOW))
            self.engine.allocator.start_sequence(shadow)  # a prefix cached here counts
            held = self.incoming[request_id] = (shadow, Received())
        shadow, received = held
        received.append(start, payload)
        allocator = self.engine.allocator
        ok = allocator.allocate_slots(shadow, max(0, reserve_tokens - shadow.num_computed_tokens))
        if not ok:
            self._drop(request_id)
        self.outbox.send(("mig_held", self.index, request_id, ok))

    def _land(self, seq: Sequence, start: int, payload) -> None:
        shadow, received = self.incoming.pop(seq.id, (None, Received()))
        received.append(start, payload)
        if shadow is not None:
            self.engine.allocator.free(shadow)  # the continuation takes the blocks in its own name
        self.connector.receive(seq.id, received.payload(payload.read_at))
        self.engine.add_sequence(seq)  # its scheduler allocates the blocks (at once, or when it can)

    def _drop(self, request_id: str) -> None:
        held = self.incoming.pop(request_id, None)
        if held is not None:
            self.engine.allocator.free(held[0])
