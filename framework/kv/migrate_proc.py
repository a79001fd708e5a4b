"""Live migration's KV between engine processes: real bytes, read from one pool and written into another.

The stages are the parent's (:mod:`servelab.cluster.procs.migration`); each engine process of a
cluster whose ``migration_policy`` moves requests holds one :class:`ProcessMigrationConnector` (the
``pd_process`` connector's pool reads and writes, :mod:`servelab.kv.pd.process`, for a ``mixed``
replica) and the child's side of the messages (:mod:`servelab.cluster.procs.migrate_child`):

- Source side: :meth:`ProcessMigrationConnector.read` copies the KV of a running request's tokens
  ``[start, end)`` out of the pool (every layer, K and V, scales included) into a host
  :class:`~servelab.kv.pd.process.KVPayload`, between two steps, while the request keeps decoding;
  at the stop the last tokens are read the same way and the engine ends the request (its blocks
  are free: the bytes are in the payload).
- Target side: each stage's payload is kept in host memory (:class:`Received`, its tokens appended)
  while the target's allocator holds blocks for them under a shadow id; when the continued sequence
  arrives the shadow goes, the whole payload is :meth:`~ProcessMigrationConnector.receive` d and the
  engine is given the sequence (``Engine.add_sequence``): its scheduler allocates the blocks, the
  connector says every token but the last is there (a synchronous load) and writes them before the
  forward pass (``start_load_kv``), then tells ``on_landed`` (the request id and when, on
  ``time.perf_counter``). Unlike a prompt's hand-off, the first token's time is not stamped again.

The prefill->decode hand-off is the same door at the first token with one stage and no pre-copy.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from servelab.kv.pd.process import KVPayload, ProcessKVConnector


@dataclass
class Received:
    """What a target holds of one request migrating to it: the KV of its tokens ``[0, num_tokens)``
    (stages appended in order), and the bytes that came."""

    data: torch.Tensor | None = None
    scales: torch.Tensor | None = None
    num_tokens: int = 0
    nbytes: int = 0

    def append(self, start: int, payload: KVPayload) -> None:
        """A stage's KV of tokens ``[start, start + payload.num_tokens)``; ``start`` must follow on."""
        if start != self.num_tokens:
            raise ValueError(f"a migration stage starts at token {start}, the KV held ends at {self.num_tokens}")
        self.nbytes += payload.nbytes
        self.num_tokens += payload.num_tokens
        self.data = payload.data.clone() if self.data is None else torch.cat((self.data, payload.data), dim=2)
        if payload.scales is not None:
            self.scales = (payload.scales.clone() if self.scales is None
                           else torch.cat((self.scales, payload.scales), dim=2))

    def payload(self, read_at: float) -> KVPayload:
        assert self.data is not None, "a migration brings at least one stage"
        return KVPayload(self.num_tokens, self.data, self.scales, read_at, 0.0)


@dataclass
class ProcessMigrationConnector(ProcessKVConnector):
    """A mixed replica's end of live migration between engine processes; :meth:`bind` it to the executor."""

    role: str = "mixed"
    on_landed: Callable[[str, float], None] = lambda request_id, at: None
    _incoming: set[str] = field(default_factory=set)

    name = "migrate_process"

    def read(self, block_ids: list[int], start: int, end: int, read_at: float | None = None) -> KVPayload:
        """The KV of tokens ``[start, end)`` held in ``block_ids`` (a request's block table), as a host payload."""
        assert self.pool is not None, "bind() the connector to its executor"
        read_at = time.perf_counter() if read_at is None else read_at
        slots = self._slots(block_ids, start, end - start).to(self.pool.data.device)
        data = self.pool.data.flatten(2, 3).index_select(2, slots).cpu()
        scales = (self.pool.scales.flatten(2, 3).index_select(2, slots).cpu() if self.pool.scales is not None
                  else None)
        return KVPayload(end - start, data, scales, read_at, 0.0)

    def receive(self, request_id: str, payload: KVPayload) -> None:
        """The whole KV of a migrating request (tokens from 0) arrived, before its sequence is added."""
        super().receive(request_id, payload)
        self._incoming.add(request_id)

    def start_load_kv(self) -> None:
        loads, self._loads = self._loads, []
        for load in loads:
            self._write(load)
            if load.seq.id in self._incoming:
                self._incoming.discard(load.seq.id)
                self.on_landed(load.seq.id, time.perf_counter())
