"""Live migration's KV in the simulator, as a KV connector (:mod:`servelab.core.kv_connector`).

Every replica of a cluster whose ``migration_policy`` moves requests gets a :class:`MigrationConnector`;
all of them share one :class:`MigrationLinks`, which prices each copy over the link between the two
replicas (:mod:`servelab.kv.link`: the same links and formula as the prefill->decode hand-off; a
sending replica's links carry one copy at a time). The stages themselves are the cluster's
(:mod:`servelab.cluster.migration`); the connector is the door the KV goes through:

- Source side: the stopped request ends on its engine (``Engine.abort``); ``request_finished``
  keeps its blocks (:meth:`MigrationConnector.stop` named it) until the target took the KV, then
  ``get_finished`` lists it as sent and the engine frees them.
- Target side: the cluster hands the continued sequence to the target engine
  (``Engine.add_sequence``) once the last copy landed, after :meth:`MigrationConnector.expect`;
  its scheduler learns that every token but the last is external and asynchronous, allocates the
  blocks through its own allocator, and ``update_state_after_alloc`` reports it received at once
  (the bytes are there): it is seated at the target's next step and decodes on.

The prefill->decode hand-off (:mod:`servelab.kv.pd.sim`) is the same door at the first token with no
pre-copy: its KV is the prompt's, sent once the decode replica allocated the blocks.

Nothing moves: the bytes are priced, the time is the cluster's virtual clock.
"""

from __future__ import annotations

from typing import Callable, Sequence as Seq

from servelab.core.kv_connector import KVConnector
from servelab.core.request import Sequence
from servelab.kv.link import KVLink


class MigrationLinks:
    """The links between a cluster's replicas and what copies over them cost; its replicas' connectors.

    ``links[(s, t)]``: the link from replica ``s`` to ``t``; ``kv_bytes_per_token``: one token's KV
    over all layers and ranks. ``on_taken(target, seq)``: a target engine allocated the blocks of
    a sequence that migrated to it (the cluster frees the source's copy)."""

    def __init__(self, links: dict[tuple[int, int], KVLink], kv_bytes_per_token: float) -> None:
        self.links = links
        self.kv_bytes_per_token = kv_bytes_per_token
        self.endpoints: dict[int, MigrationConnector] = {}
        self.on_taken: Callable[[int, Sequence], None] = lambda target, seq: None
        self._link_free: dict[int, float] = {}

    def endpoint(self, index: int) -> "MigrationConnector":
        """The connector of replica ``index``."""
        connector = self.endpoints[index] = MigrationConnector(self, index)
        return connector

    def copy(self, source: int, target: int, num_tokens: int, at: float) -> tuple[float, float]:
        """``(bytes, done)``: copying ``num_tokens`` tokens' KV from ``source`` to ``target``, asked at
        ``at``, starts when the source's links are free and lands at ``done`` (the link's latency plus
        the bytes over its lanes, :class:`~servelab.kv.link.KVLink`)."""
        nbytes = num_tokens * self.kv_bytes_per_token
        start = max(at, self._link_free.get(source, 0.0))
        link = self.links[(source, target)]  # each copy pays the latency: a stop-and-copy with no new block too
        done = start + link.latency_s + nbytes / (link.bytes_per_s * link.lanes)
        self._link_free[source] = done
        return nbytes, done


class MigrationConnector(KVConnector):
    """One replica's end of :class:`MigrationLinks`: it sends requests that migrate away and receives
    those that migrate to it."""

    name = "migrate_sim"

    def __init__(self, links: MigrationLinks, index: int) -> None:
        self.links = links
        self.index = index
        self.stopping: set[str] = set()  # stopped here for the last copy: blocks kept until the target took them
        self.incoming: dict[str, int] = {}  # continued sequences coming in -> tokens of KV they bring
        self.sent: set[str] = set()
        self.received: set[str] = set()

    # ---- what the cluster tells it ----------------------------------------------------------------
    def stop(self, request_id: str) -> None:
        """The cluster is about to stop ``request_id`` here for its last copy: keep its blocks."""
        self.stopping.add(request_id)

    def release(self, request_id: str) -> None:
        """The target took ``request_id``'s KV: its blocks here may go (at the next poll)."""
        self.stopping.discard(request_id)
        self.sent.add(request_id)

    def expect(self, seq: Sequence) -> None:
        """``seq`` (a continued sequence) is about to be added here with every token's KV but its last."""
        self.incoming[seq.id] = seq.num_tokens - 1

    # ---- the connector ------------------------------------------------------------------------------
    def get_num_new_matched_tokens(self, seq: Sequence, num_computed_tokens: int) -> tuple[int, bool]:
        tokens = self.incoming.get(seq.id)
        if tokens is None:
            return 0, False
        return max(0, tokens - num_computed_tokens), True

    def update_state_after_alloc(self, seq: Sequence, block_ids: Seq[int], num_external_tokens: int) -> None:
        if self.incoming.pop(seq.id, None) is None:
            return  # an admission with nothing to load
        self.received.add(seq.id)  # the bytes landed before the sequence was added
        self.links.on_taken(self.index, seq)

    def request_finished(self, seq: Sequence, block_ids: Seq[int]) -> bool:
        return seq.id in self.stopping

    def get_finished(self) -> tuple[set[str], set[str]]:
        sent, received = self.sent, self.received
        self.sent, self.received = set(), set()
        return sent, received
