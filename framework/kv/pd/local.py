"""KV connectors between real engines in one process: block contents move between their pools.

:class:`LocalKVLink` joins engines that each run a :class:`~servelab.exec.executor.LocalExecutor`
in this process. A *sending* engine's connector keeps a finished request's blocks
(``request_finished``); a *receiving* engine that is given the request's continuation
(``Engine.add_sequence``) learns from its connector that those tokens' KV exists
(``get_num_new_matched_tokens``: a synchronous load), allocates blocks through its own
allocator, and before its next forward pass the connector's worker side copies the block
contents from the sender's pool into the receiver's (``start_load_kv``, all layers, scales
included); the sender's blocks are then reported sent and freed. The receiving engine's tokens
equal one engine's (tests/test_kv_connector.py).

It is the prefill/decode hand-off on real tensors in its simplest form: one process, one device,
a copy. Across processes the same scheduler side would stand; ``start_load_kv`` would read over a
transport (NCCL, NIXL, shared memory) and report loads asynchronously.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence as Seq

from servelab.core.kv_connector import KVConnector
from servelab.core.request import Sequence, Status
from servelab.exec.kv_pool import KVPool


@dataclass
class _Held:
    sender: "LocalKVConnector"
    block_ids: list[int]
    num_tokens: int  # tokens whose KV the blocks hold


class LocalKVLink:
    """The engines of one process that hand KV to each other."""

    def __init__(self) -> None:
        self.held: dict[str, _Held] = {}  # request id -> the kept blocks of the engine that computed it

    def endpoint(self, sends: bool = False, receives: bool = False) -> "LocalKVConnector":
        """A connector for one engine; bind it to that engine's executor with :meth:`LocalKVConnector.bind`."""
        return LocalKVConnector(self, sends, receives)


class LocalKVConnector(KVConnector):
    """One engine's end of a :class:`LocalKVLink`."""

    name = "local"

    def __init__(self, link: LocalKVLink, sends: bool, receives: bool) -> None:
        self.link = link
        self.sends = sends
        self.receives = receives
        self.pool: KVPool | None = None
        self._loads: list[tuple[str, _Held, list[tuple[int, int]]]] = []
        self._sent: set[str] = set()

    def bind(self, executor) -> "LocalKVConnector":
        """The KV pool of ``executor`` (a LocalExecutor: one worker in this process)."""
        return self.bind_pool(getattr(executor, "kv_pool", None), type(executor).__name__)

    def bind_pool(self, pool: KVPool | None, owner: str = "this executor") -> "LocalKVConnector":
        """Read and write ``pool`` (an executor's public ``kv_pool``)."""
        if not isinstance(pool, KVPool):
            raise TypeError(f"a local KV connector needs an executor with one worker in this process "
                            f"(backend=local), not {owner}")
        self.pool = pool
        return self

    # ---- scheduler side -----------------------------------------------------------------
    def get_num_new_matched_tokens(self, seq: Sequence, num_computed_tokens: int) -> tuple[int, bool]:
        held = self.link.held.get(seq.id) if self.receives else None
        if held is None or held.sender is self:
            return 0, False
        return max(0, min(held.num_tokens, seq.num_tokens - 1) - num_computed_tokens), False

    def update_state_after_alloc(self, seq: Sequence, block_ids: Seq[int], num_external_tokens: int) -> None:
        held = self.link.held.pop(seq.id, None)
        if held is None:  # an admission with nothing to load
            return
        assert self.pool is not None and held.sender.pool is not None, "bind() each connector to its executor"
        bs = self.pool.data.shape[3]  # tokens per block (KVPool: [layers, 2, blocks, block_size, ...])
        src, dst = held.sender.pool.data, self.pool.data
        if (src.dtype, src.shape[:2], src.shape[3:]) != (dst.dtype, dst.shape[:2], dst.shape[3:]):
            raise ValueError(f"request {seq.id!r}: the two engines store KV differently; it cannot move as blocks")
        first = seq.num_computed_tokens // bs  # a local prefix hit is whole blocks
        last = -(-(seq.num_computed_tokens + num_external_tokens) // bs)
        pairs = [(held.block_ids[j], block_ids[j]) for j in range(first, last)]
        self._loads.append((seq.id, held, pairs))

    def request_finished(self, seq: Sequence, block_ids: Seq[int]) -> bool:
        if not self.sends or seq.status is not Status.FINISHED or not block_ids:
            return False
        self.link.held[seq.id] = _Held(self, list(block_ids), seq.num_computed_tokens)
        return True

    def get_finished(self) -> tuple[set[str], set[str]]:
        sent, self._sent = self._sent, set()
        return sent, set()  # loads are synchronous: nothing to report

    # ---- worker side --------------------------------------------------------------------
    def start_load_kv(self) -> None:
        loads, self._loads = self._loads, []
        for request_id, held, pairs in loads:
            if pairs:
                assert self.pool is not None and held.sender.pool is not None
                self.pool.copy_blocks(held.sender.pool, pairs)
            held.sender._sent.add(request_id)  # its blocks were read: the sender may free them

