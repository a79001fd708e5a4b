"""Prefill/decode disaggregation in the simulator, as KV connectors (:mod:`servelab.core.kv_connector`).

Each replica of a disaggregated cluster gets a :class:`PDConnector`; all of them share one
:class:`PDTransfers`, which knows which request's KV goes from which prefill replica to which
decode replica and prices the bytes over the link between them (:mod:`servelab.kv.link`).

- Prefill side: when a request ends, ``request_finished`` keeps its blocks if the cluster will hand
  it on (``PDTransfers.should_send``); they are freed when the transfer has landed
  (``get_finished`` lists it as sent).
- Decode side: the cluster hands the continued sequence to the decode engine
  (``Engine.add_sequence``) after :meth:`PDTransfers.expect`; the scheduler asks
  ``get_num_new_matched_tokens`` (the prompt, less what the decode replica's own prefix cache
  holds, asynchronously), allocates the blocks through its own allocator when the pool takes them
  (back-pressure: else it waits, on the sending replica's blocks), and ``update_state_after_alloc``
  starts the transfer at the cluster's current time. The landing is an event of the cluster's
  loop; then ``get_finished`` lists the request as received and the scheduler seats it.

Nothing moves: the bytes are priced, the time is the cluster's virtual clock.
"""

from __future__ import annotations

from typing import Callable, Sequence as Seq

from servelab.kv.link import KVLink, Transfer, schedule_transfer
from servelab.core.kv_connector import KVConnector
from servelab.core.request import Sequence, Status


class PDTransfers:
    """The KV transfers of one disaggregated cluster: who sends what to whom, their price, their sums.

    The cluster fills in ``links``, ``kv_bytes_per_token``, ``num_layers``, ``overlap`` and the
    callbacks (``should_send``, ``at``: put an action on its event queue, ``on_started`` and
    ``on_landed``), and sets ``now`` to its current time before each event and replica step.
    """

    def __init__(self) -> None:
        self.links: dict[tuple[int, int], KVLink] = {}
        self.kv_bytes_per_token = 0.0
        self.num_layers = 1
        self.overlap = True
        self.now = 0.0
        self.should_send: Callable[[Sequence], bool] = lambda seq: False
        self.at: Callable[[float, Callable[[], None]], None] = lambda t, action: None
        self.on_started: Callable[[int, int, Sequence, int], None] = lambda p, d, seq, hit: None
        self.on_landed: Callable[[int, int, Sequence, Sequence, float], None] = lambda p, d, ps, ds, t: None
        self.endpoints: dict[int, PDConnector] = {}
        self.transfers: list[Transfer] = []
        self.keep_transfers = False  # tests read each transfer; a long run keeps only the sums
        self.num_kv_transfers = 0
        self.kv_transfer_bytes = 0.0
        self.kv_transfer_s = 0.0
        self.kv_transfer_exposed_s = 0.0
        self._expected: dict[str, tuple[int, int, Sequence]] = {}  # decode seq id -> (prefill, decode, prefill seq)
        self._link_free: dict[int, float] = {}

    def endpoint(self, index: int, role: str) -> "PDConnector":
        """The connector of replica ``index`` (``role`` "prefill" or "decode")."""
        connector = self.endpoints[index] = PDConnector(self, index, role)
        if role == "prefill":
            self._link_free[index] = 0.0
        return connector

    def expect(self, sender: int, receiver: int, pseq: Sequence, dseq_id: str) -> None:
        """Prefill replica ``sender`` holds the KV of ``pseq``; decode replica ``receiver`` is about
        to be given ``dseq_id``, its continuation."""
        self._expected[dseq_id] = (sender, receiver, pseq)

    def waiting_for(self, receiver: int) -> int:
        """Transfers to ``receiver`` not started yet (its pool has not taken them)."""
        return sum(1 for _, d, _ in self._expected.values() if d == receiver)

    def _holds(self, receiver: int, seq_id: str) -> bool:
        expected = self._expected.get(seq_id)
        return expected is not None and expected[1] == receiver

    def _start(self, receiver: int, dseq: Sequence, num_tokens: int) -> None:
        """The decode replica allocated ``dseq``'s blocks now: price the transfer, queue its landing."""
        p, d, pseq = self._expected.pop(dseq.id)
        hit = dseq.num_computed_tokens
        nbytes = num_tokens * self.kv_bytes_per_token
        prefill_start, prefill_end = pseq.first_scheduled_time, pseq.finish_time
        assert prefill_start is not None and prefill_end is not None, "a handed-off sequence ran and finished"
        start, done, duration = schedule_transfer(self.links[(p, d)], nbytes, self._link_free[p], prefill_start,
                                                  prefill_end, self.now, self.num_layers, self.overlap)
        self._link_free[p] = done
        self.num_kv_transfers += 1
        self.kv_transfer_bytes += nbytes
        self.kv_transfer_s += duration
        self.kv_transfer_exposed_s += done - prefill_end
        if self.keep_transfers:
            self.transfers.append(Transfer(dseq.id, p, d, nbytes, start, done, duration, done - prefill_end))
        self.on_started(p, d, dseq, hit)
        self.at(done, lambda: self._land(p, d, pseq, dseq, done))

    def _land(self, p: int, d: int, pseq: Sequence, dseq: Sequence, t: float) -> None:
        self.endpoints[p].sent.add(pseq.id)
        self.endpoints[d].received.add(dseq.id)
        self.on_landed(p, d, pseq, dseq, t)


class PDConnector(KVConnector):
    """One replica's end of :class:`PDTransfers`: a prefill replica sends, a decode replica receives."""

    name = "pd_sim"

    def __init__(self, transfers: PDTransfers, index: int, role: str) -> None:
        self.transfers = transfers
        self.index = index
        self.role = role
        self.sent: set[str] = set()
        self.received: set[str] = set()

    def get_num_new_matched_tokens(self, seq: Sequence, num_computed_tokens: int) -> tuple[int, bool]:
        if self.role == "decode" and self.transfers._holds(self.index, seq.id):
            return seq.prompt_len - num_computed_tokens, True  # the prompt; the first token is in seq
        return 0, False

    def update_state_after_alloc(self, seq: Sequence, block_ids: Seq[int], num_external_tokens: int) -> None:
        if self.transfers._holds(self.index, seq.id):  # else an admission with nothing to load
            self.transfers._start(self.index, seq, num_external_tokens)

    def request_finished(self, seq: Sequence, block_ids: Seq[int]) -> bool:
        return self.role == "prefill" and seq.status is Status.FINISHED and self.transfers.should_send(seq)

    def get_finished(self) -> tuple[set[str], set[str]]:
        sent, received = self.sent, self.received
        self.sent, self.received = set(), set()
        return sent, received
