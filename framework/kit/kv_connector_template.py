"""The ``servelab new-plugin kv_connector <name>`` skeleton (named by the kinds table): a remote KV
store in the manner of LMCache or Mooncake, held in this process's memory, that a third party turns
into a client of its own store by replacing :meth:`_put` / :meth:`_get` / :meth:`_has`."""

from __future__ import annotations

from string import Template

from servelab.kit.plugin_templates import _HEAD

BODY = '''\
import hashlib
from collections import OrderedDict

from servelab.plugin_api import KVConnectorPlugin


@dataclass
class ${Class}Config:
    capacity_blocks: int = 4096  # blocks the store keeps (least recently used goes first)


class $Class(KVConnectorPlugin):
    """A KV store outside the engine: every finished request's full blocks are saved under their
    prefix key (a hash of every token up to the block's end), and a new request whose prompt starts
    with saved blocks loads them instead of computing them. Keys are computed from the tokens, so
    the store can outlive the engine (or sit on another machine) without servelab knowing it.

    Loads are synchronous (in place before the next forward pass: ``start_load_kv``); saves keep
    the blocks until ``save_kv`` has read them. In the simulator (``self.kv_pool`` is None) only the
    keys are kept: no bytes move. Replace ``_put``, ``_get`` and ``_has`` with your store's client."""

    name = "$name"
    Config = ${Class}Config

    def __init__(self, config, context):
        super().__init__(config, context)
        if config.capacity_blocks < 1:
            raise ValueError(f"kv_connector.capacity_blocks={config.capacity_blocks}: must be 1 or more")
        self.blocks = OrderedDict()  # key -> the block's bytes (None in the simulator)
        self._loads = []  # (key, device block) to copy in before the next forward pass
        self._saves = {}  # request id -> [(key, device block)] to copy out after the step
        self._sent = set()

    # ---- the store (replace these with your store's client) ------------------------------
    def _has(self, key):
        return key in self.blocks

    def _get(self, key):
        self.blocks.move_to_end(key)
        return self.blocks[key]

    def _put(self, key, value):
        self.blocks[key] = value
        while len(self.blocks) > self.config.capacity_blocks:
            self.blocks.popitem(last=False)

    # ---- keys ----------------------------------------------------------------------------
    def _keys(self, tokens):
        """One key per full block of ``tokens``: a hash of every token up to the block's end."""
        keys, digest, bs = [], b"", self.block_size
        for start in range(0, len(tokens) - bs + 1, bs):
            digest = hashlib.blake2b(digest + repr(list(tokens[start:start + bs])).encode(), digest_size=16).digest()
            keys.append(digest)
        return keys

    # ---- scheduler side --------------------------------------------------------------------
    def get_num_new_matched_tokens(self, seq, num_computed_tokens):
        bs = self.block_size
        keys = self._keys(seq.token_ids[:seq.num_tokens - 1])  # the last token is always computed here
        n = 0
        for key in keys[num_computed_tokens // bs:]:
            if not self._has(key):
                break
            n += 1
        return n * bs, False

    def update_state_after_alloc(self, seq, block_ids, num_external_tokens):
        bs = self.block_size
        first = seq.num_computed_tokens // bs
        keys = self._keys(seq.token_ids[:seq.num_computed_tokens + num_external_tokens])
        self._loads.extend((keys[j], block_ids[j]) for j in range(first, len(keys)))

    def request_finished(self, seq, block_ids):
        keys = self._keys(seq.token_ids[:seq.num_computed_tokens])  # blocks whose KV is computed
        new = [(key, block_ids[j]) for j, key in enumerate(keys) if not self._has(key)]
        if not new:
            return False
        self._saves[seq.id] = new
        return True  # keep the blocks until save_kv has read them

    def get_finished(self):
        sent, self._sent = self._sent, set()
        return sent, set()

    # ---- worker side ---------------------------------------------------------------------
    def start_load_kv(self):
        pool = self.kv_pool
        for key, block in self._loads:
            value = self._get(key)
            if pool is not None:
                data, scales = value
                pool.data[:, :, block].copy_(data)
                if scales is not None:
                    pool.scales[:, :, block].copy_(scales)
        self._loads = []

    def save_kv(self):
        pool = self.kv_pool
        for request_id, pairs in self._saves.items():
            for key, block in pairs:
                value = None
                if pool is not None:
                    value = (pool.data[:, :, block].clone(),
                             pool.scales[:, :, block].clone() if pool.scales is not None else None)
                self._put(key, value)
            self._sent.add(request_id)
        self._saves = {}


@hookimpl
def servelab_register_kv_connectors():
    return [$Class]
'''

TEMPLATE = Template(_HEAD + BODY)
