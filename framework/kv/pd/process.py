"""A KV connector between engines in different processes: a prompt's KV leaves one process as a tensor.

One :class:`ProcessKVConnector` per engine process of a disaggregated wall-clock cluster
(:mod:`servelab.cluster.procs.cluster`); the processes' pipes and queues (torch.multiprocessing) are the
transport.

- Prefill side (``role="prefill"``): ``request_finished`` keeps a finished request's blocks when the
  cluster will hand it on (``should_send``); after the step (``save_kv``) the worker side reads the
  KV of its computed tokens out of the pool (every layer, K and V, scales included) into one
  contiguous host tensor per kind and hands it to ``send(seq, payload)`` (the process sends it on its
  pipe to the parent: the tensor travels as shared memory, not as pickled bytes; on a GPU it is
  copied to host memory first, since a CUDA tensor received over IPC cannot be passed on); the
  blocks are then reported sent (``get_finished``) and freed by the engine.
- Decode side (``role="decode"``): the process :meth:`receive` s a payload before the engine is given
  the continued sequence (``Engine.add_sequence``); ``get_num_new_matched_tokens`` answers the
  payload's tokens after the local prefix hit, as a synchronous load (the bytes are already in this
  process); once the scheduler allocated the blocks, ``start_load_kv`` (before the forward pass)
  writes the tokens into their slots, stamps the first token's time (it reaches the client with its
  KV, as in the simulator) and tells ``on_loaded`` what moved: bytes, and the wall time from the
  first read on the prefill side to the last write here (processes on one machine share
  ``time.perf_counter``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Sequence as Seq

import torch

from servelab.core.kv_connector import KVConnector
from servelab.core.request import Sequence, Status
from servelab.exec.kv_pool import KVPool


@dataclass
class KVPayload:
    """The KV of a prompt's first ``num_tokens`` tokens: ``data[L, 2, num_tokens, kv_heads, head_dim]``
    (``scales[L, 2, num_tokens, kv_heads]`` for a quantised pool), and when its read started
    (``time.perf_counter``) and the prefill ended (engine seconds)."""

    num_tokens: int
    data: torch.Tensor
    scales: torch.Tensor | None
    read_at: float
    prefill_end_s: float

    @property
    def nbytes(self) -> int:
        return self.data.nbytes + (self.scales.nbytes if self.scales is not None else 0)


@dataclass
class Loaded:
    """One landed transfer, as the decode side measured it."""

    request_id: str
    nbytes: int
    transfer_s: float  # read on the prefill side -> written here
    exposed_s: float  # the prefill's end -> written here (waiting for blocks included)
    cached_tokens: int  # the prompt prefix the decode replica had cached (not written)


@dataclass
class _Load:
    seq: Sequence
    payload: KVPayload
    block_ids: list[int]
    start: int
    count: int


@dataclass(frozen=True)
class ProcessLink:
    """An engine process's side of the cluster's transport (the ``transport`` of its
    :class:`~servelab.core.contexts.KVClusterLink`): what ``kv_connector=pd_process`` calls."""

    send: Callable[[Sequence, "KVPayload"], None]
    should_send: Callable[[Sequence], bool]
    on_loaded: Callable[["Loaded"], None]


@dataclass
class ProcessKVConnector(KVConnector):
    """One engine process's end of the hand-off; :meth:`bind` it to the engine's executor."""

    role: str
    send: Callable[[Sequence, KVPayload], None] = lambda seq, payload: None
    should_send: Callable[[Sequence], bool] = lambda seq: False
    on_loaded: Callable[[Loaded], None] = lambda loaded: None
    now: Callable[[], float] = time.perf_counter  # engine seconds (the decode side stamps the first token)
    pool: KVPool | None = None
    _kept: dict[str, tuple[Sequence, list[int]]] = field(default_factory=dict)
    _sent: set[str] = field(default_factory=set)
    _held: dict[str, KVPayload] = field(default_factory=dict)
    _loads: list[_Load] = field(default_factory=list)

    name = "process"

    def bind(self, executor) -> "ProcessKVConnector":
        """The KV pool of ``executor`` (one worker in this process: tensor_parallel_size=1)."""
        return self.bind_pool(getattr(executor, "kv_pool", None), type(executor).__name__)

    def bind_pool(self, pool: KVPool | None, owner: str = "this executor") -> "ProcessKVConnector":
        """Read and write ``pool`` (an executor's public ``kv_pool``)."""
        if not isinstance(pool, KVPool):
            raise TypeError(f"a process KV connector reads one worker's KV pool in this process, not "
                            f"{owner}'s (prefill/decode replicas need tensor_parallel_size=1)")
        self.pool = pool
        return self

    def keeps(self, request_id: str) -> bool:
        """Whether the blocks of ``request_id`` (just ended) are kept for a send after this step."""
        return request_id in self._kept

    def receive(self, request_id: str, payload: KVPayload) -> None:
        """The prompt KV of ``request_id`` arrived (before its sequence is given to the engine)."""
        self._held[request_id] = payload

    # ---- scheduler side -----------------------------------------------------------------
    def get_num_new_matched_tokens(self, seq: Sequence, num_computed_tokens: int) -> tuple[int, bool]:
        payload = self._held.get(seq.id)
        if payload is None:
            return 0, False
        return max(0, min(payload.num_tokens, seq.num_tokens - 1) - num_computed_tokens), False

    def update_state_after_alloc(self, seq: Sequence, block_ids: Seq[int], num_external_tokens: int) -> None:
        payload = self._held.pop(seq.id, None)
        if payload is None:  # an admission with nothing to load
            return
        self._loads.append(_Load(seq, payload, list(block_ids), seq.num_computed_tokens, num_external_tokens))

    def request_finished(self, seq: Sequence, block_ids: Seq[int]) -> bool:
        if self.role != "prefill" or seq.status is not Status.FINISHED or not block_ids or not self.should_send(seq):
            return False
        self._kept[seq.id] = (seq, list(block_ids))
        return True

    def get_finished(self) -> tuple[set[str], set[str]]:
        sent, self._sent = self._sent, set()
        return sent, set()  # loads are synchronous: nothing to report

    # ---- worker side --------------------------------------------------------------------
    def save_kv(self) -> None:
        kept, self._kept = self._kept, {}
        for request_id, (seq, block_ids) in kept.items():
            read_at = time.perf_counter()
            data, scales = self._read(block_ids, seq.num_computed_tokens)
            assert seq.finish_time is not None  # it ended
            self.send(seq, KVPayload(seq.num_computed_tokens, data, scales, read_at, seq.finish_time))
            self._sent.add(request_id)  # read out: the engine may free the blocks

    def start_load_kv(self) -> None:
        loads, self._loads = self._loads, []
        for load in loads:
            self._write(load)
            now = self.now()
            load.seq.token_times[0] = now  # the first token reaches the client with its KV
            p = load.payload
            self.on_loaded(Loaded(load.seq.id, p.nbytes, time.perf_counter() - p.read_at, now - p.prefill_end_s,
                                  load.start))

    def _slots(self, block_ids: list[int], start: int, count: int) -> torch.Tensor:
        assert self.pool is not None, "bind() the connector to its executor"
        bs = self.pool.data.shape[3]
        positions = torch.arange(start, start + count)
        return torch.tensor(block_ids, dtype=torch.long)[positions // bs] * bs + positions % bs

    def _read(self, block_ids: list[int], num_tokens: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        assert self.pool is not None, "bind() the connector to its executor"
        slots = self._slots(block_ids, 0, num_tokens).to(self.pool.data.device)
        data = self.pool.data.flatten(2, 3).index_select(2, slots).cpu()
        scales = (self.pool.scales.flatten(2, 3).index_select(2, slots).cpu() if self.pool.scales is not None
                  else None)
        return data, scales

    def _write(self, load: _Load) -> None:
        assert self.pool is not None, "bind() the connector to its executor"
        pool, src = self.pool, load.payload.data
        if (src.dtype, src.shape[:2], src.shape[3:]) != (pool.data.dtype, pool.data.shape[:2], pool.data.shape[4:]):
            raise ValueError(f"request {load.seq.id!r}: the prefill replica's KV ({src.dtype}, layers x kinds "
                             f"{tuple(src.shape[:2])}, per token {tuple(src.shape[3:])}) is not stored as this "
                             f"replica's ({pool.data.dtype}, {tuple(pool.data.shape[:2])}, {tuple(pool.data.shape[4:])})")
        if not load.count:
            return
        device = pool.data.device
        slots = self._slots(load.block_ids, load.start, load.count).to(device)
        part = slice(load.start, load.start + load.count)
        pool.data.flatten(2, 3).index_copy_(2, slots, src[:, :, part].to(device))
        if pool.scales is not None and load.payload.scales is not None:
            pool.scales.flatten(2, 3).index_copy_(2, slots, load.payload.scales[:, :, part].to(device))
