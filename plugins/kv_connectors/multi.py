"""``kv_connector=multi``: several KV connectors behind the one door (vLLM's ``MultiConnector``).

A decode replica of a prefill/decode cluster that also has a host tier, a host tier in front of a
remote store: each part stays the connector it is, and this one asks them in order.

- Loads: ``get_num_new_matched_tokens`` asks each part in order; the first that matches (a token
  count above 0, or an asynchronous load) serves the request, and only that part hears of its
  blocks (``update_state_after_alloc``) and of its later loads. A part that answered nothing is
  told nothing.
- Saves: ``request_finished`` asks every part (each may store the blocks, or keep them for a
  send); the blocks are kept while any part keeps them, and ``get_finished`` reports the request
  sent once every part that kept it has (freed once).
- The worker side (``start_load_kv``, ``wait_for_load``, ``save_kv``, ``wait_for_save``) and
  ``get_finished`` run on every part, in order; the sets are joined.
- Time: each part prices its own transfers on its own link (``get_step_transfer_time``); the links
  run side by side, so a step's loads take the longest part's seconds (saves likewise), and they
  overlap compute only if every loading part's do. What the clock then added and hid is shared out
  to the loading parts in proportion to their load seconds (``transfer_priced``).

Its parts are ``self.connectors`` (``servelab.kv.connectors.parts`` walks them: the stack finds the
tiers store, a cluster its hand-off endpoint, through it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Sequence as Seq

from servelab.plugin_api import (NO_TRANSFER, ConfigError, KVConnector, KVConnectorContext, KVConnectorPlugin,
                                 KVTransferTime, Sequence)


@dataclass
class MultiConfig:
    connectors: List[str] = field(default_factory=list)  # kv_connector names, asked in this order


class MultiConnector(KVConnectorPlugin):
    """Parts asked in order for loads; every part for saves and the worker side."""

    name = "multi"
    Config = MultiConfig

    def __init__(self, config: MultiConfig, context: KVConnectorContext, connectors: Seq[KVConnector] = ()) -> None:
        super().__init__(config, context)
        if not connectors:
            if context.build is None or not config.connectors:
                raise ConfigError("kv_connector=multi composes connectors: list them, e.g. "
                                  "kv_connector.connectors=[tiers,my_store]")
            bad = [n for n in config.connectors if n in ("multi", "none")]
            if bad:
                raise ConfigError(f"kv_connector.connectors={list(config.connectors)}: {bad[0]} is not a part "
                                  "(list the connectors to compose)")
            connectors = [context.build(n) for n in config.connectors]
        self.connectors: list[KVConnector] = list(connectors)
        self._keepers: dict[str, int] = {}  # request id -> parts still reading its blocks (kept by more than one)
        self._loading: list[tuple[KVConnector, float]] = []  # the parts whose loads the last step read, and their seconds

    # ---- scheduler side -----------------------------------------------------------------
    def get_num_new_matched_tokens(self, seq: Sequence, num_computed_tokens: int) -> tuple[int, bool]:
        for part in self.connectors:
            n, load_async = part.get_num_new_matched_tokens(seq, num_computed_tokens)
            if n > 0 or load_async:
                return n, load_async
        return 0, False

    def update_state_after_alloc(self, seq: Sequence, block_ids: Seq[int], num_external_tokens: int) -> None:
        for part in self.connectors:  # the same question as the scheduler's: the part that matched
            n, load_async = part.get_num_new_matched_tokens(seq, seq.num_computed_tokens)
            if n > 0 or load_async:
                part.update_state_after_alloc(seq, block_ids, num_external_tokens)
                return
        if self.connectors:  # nothing matches: the first part hears of it, as it would alone
            self.connectors[0].update_state_after_alloc(seq, block_ids, num_external_tokens)

    def request_finished(self, seq: Sequence, block_ids: Seq[int]) -> bool:
        keepers = sum(bool(part.request_finished(seq, block_ids)) for part in self.connectors)
        if keepers > 1:
            self._keepers[seq.id] = keepers
        return keepers > 0

    def get_finished(self) -> tuple[set[str], set[str]]:
        sent: set[str] = set()
        received: set[str] = set()
        for part in self.connectors:
            s, r = part.get_finished()
            received |= r
            for request_id in s:
                left = self._keepers.get(request_id, 1) - 1
                if left > 0:
                    self._keepers[request_id] = left
                    continue
                self._keepers.pop(request_id, None)
                sent.add(request_id)
        return sent, received

    def get_step_transfer_time(self) -> KVTransferTime:
        times = [(part, part.get_step_transfer_time()) for part in self.connectors]
        loads = [(part, t) for part, t in times if t.load_s]
        self._loading = [(part, t.load_s) for part, t in loads]
        saves = [t.save_s for _, t in times if t.save_s]
        if not loads and not saves:
            return NO_TRANSFER
        return KVTransferTime(load_s=max((t.load_s for _, t in loads), default=0.0), save_s=max(saves, default=0.0),
                              overlap=all(t.overlap for _, t in loads))

    def transfer_priced(self, added_s: float, hidden_s: float) -> None:
        total = sum(s for _, s in self._loading)
        for part, seconds in self._loading:
            part.transfer_priced(added_s * seconds / total, hidden_s * seconds / total)
        self._loading = []

    # ---- worker side --------------------------------------------------------------------
    def start_load_kv(self) -> None:
        for part in self.connectors:
            part.start_load_kv()

    def wait_for_load(self) -> None:
        for part in self.connectors:
            part.wait_for_load()

    def save_kv(self) -> None:
        for part in self.connectors:
            part.save_kv()

    def wait_for_save(self) -> None:
        for part in self.connectors:
            part.wait_for_save()
