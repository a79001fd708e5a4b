"""The KV connector: the one door by which KV enters or leaves an engine.

Modelled on vLLM v1's ``KVConnectorBase_V1``: a *scheduler side* that deals in numbers (how many
of a request's tokens an external source holds, which blocks receive them, whether a finished
request's blocks must stay while they are sent, which loads and sends are done) and a *worker
side* that moves the bytes (on a real engine it copies block contents; in the simulator it prices
them over a link). The engine and the scheduler know nothing else about where KV comes from or
goes to: prefill->decode hand-off, host and disk tiers, a shared store and request migration are
all connectors. ``None`` (the default everywhere) means "no KV enters or leaves".

One request's life through a connector (the receiving side)::

    scheduler admits seq (in its policy's order):
      n, async_ = connector.get_num_new_matched_tokens(seq, num_computed)   # n > 0: external KV
      allocator.start_sequence(seq)                  # local prefix hit -> seq.num_computed_tokens
      not async: allocator.allocate_slots(seq, n + chunk)        # all or nothing: else it waits
                 connector.update_state_after_alloc(seq, block_ids, n)   # book the load (n may be 0)
                 allocator.mark_loaded(seq, n); the chunk after them runs in this very step
      async (also asked on arrival): blocks for every token, then update_state_after_alloc
    engine step:  connector.start_load_kv(); executor.execute(...)   # worker side: bytes move
    engine poll (start of each step):  sent, received = connector.get_finished()
      received -> scheduler.on_kv_loaded(seq) -> allocator.mark_loaded(seq, n); it runs from here

and the sending side::

    engine ends seq:  keep = connector.request_finished(seq, block_ids)
      keep -> the engine holds the blocks; freed when get_finished() lists seq.id as sent

Contracts:

- Scheduler-side methods run on the engine's thread, between steps (or inside ``schedule()``);
  they never touch tensors and never raise for an unknown request (answer "nothing external").
- ``get_num_new_matched_tokens`` has no side effects: a scheduler may ask again each step while
  the pool cannot take the request.
- The scheduler asks ``get_num_new_matched_tokens`` when it considers a waiting sequence for
  admission, in its policy's order (and on arrival, where only an asynchronous answer is acted on:
  a pushed hand-off claims blocks as soon as the pool takes them). A sequence preempted by
  recompute is asked again.
- ``update_state_after_alloc`` is called once per admission (as vLLM v1 does), with
  ``num_external_tokens`` 0 when nothing is loaded (a connector that only loads returns at once),
  and once per asynchronous load, after the blocks for every token of the sequence are allocated
  (so a landed sequence never waits for blocks). ``block_ids`` is the sequence's whole block
  table; the external tokens are those after ``seq.num_computed_tokens``. A synchronous load's
  blocks cover the loaded tokens and the chunk the scheduler computes after them in the same step;
  the bytes are in place before that forward pass (the worker side loads them in
  :meth:`start_load_kv`). With ``load_is_async`` true the scheduler waits until
  :meth:`get_finished` lists the request as received, then the sequence waits in the policy's
  queue like any other.
- ``request_finished`` is asked once for every sequence that ends (finished, aborted); True means
  the connector is still reading its blocks: the engine frees them only once :meth:`get_finished`
  lists the request as sent. A connector must eventually report every request it kept.
- ``get_finished`` returns each id once (the sets are drained).
- Nothing here writes ``seq.num_computed_tokens``: the allocator does (``start_sequence``,
  ``mark_loaded``, ``reset``) and the engine's apply does (computed tokens).
- The connector reports its own time: after each step the engine asks
  :meth:`get_step_transfer_time` for the seconds that step's loads and saves take on their links
  and prices them the same way for every connector (:func:`servelab.engine.clock.price_kv_transfer`):
  on the virtual clock a load adds what the step's compute does not hide (``overlap``) or all of
  it; on the wall clock the copies ran inside the step and are timed as they ran. The verdict
  comes back through :meth:`transfer_priced`.

No torch and no imports above ``core``: a connector module of a plugin package imports this.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar, Sequence as Seq

if TYPE_CHECKING:
    from servelab.core.request import Sequence


@dataclass(frozen=True)
class KVTransferTime:
    """The link seconds of one step's KV transfers, as the connector prices them.

    ``load_s``: loads the step's forward pass reads (it cannot finish before them); ``save_s``:
    stores and sends the step started (they run beside later steps: never added to one);
    ``overlap``: the loads stream layer by layer behind compute (the step takes ``max(load,
    compute)``), else the step waits for them, then computes (``load + compute``)."""

    load_s: float = 0.0
    save_s: float = 0.0
    overlap: bool = True


NO_TRANSFER = KVTransferTime()


class KVConnector:
    """Base class and no-op default: nothing external, nothing kept, nothing moves."""

    name: ClassVar[str] = "none"

    # ---- scheduler side -----------------------------------------------------------------
    def get_num_new_matched_tokens(self, seq: "Sequence", num_computed_tokens: int) -> tuple[int, bool]:
        """How many tokens of ``seq`` after its first ``num_computed_tokens`` (the local prefix
        cache's hit) an external source holds, and whether loading them is asynchronous (the
        sequence waits for :meth:`get_finished`) or done before the next forward pass. At most
        ``seq.num_tokens - num_computed_tokens - 1``: the last token is always computed here.
        No side effects. Default: ``(0, False)``."""
        return 0, False

    def update_state_after_alloc(self, seq: "Sequence", block_ids: Seq[int], num_external_tokens: int) -> None:
        """Blocks ``block_ids`` (``seq``'s whole table) were allocated for ``num_external_tokens``
        tokens after ``seq.num_computed_tokens``: start loading them. Default: nothing."""

    def request_finished(self, seq: "Sequence", block_ids: Seq[int]) -> bool:
        """``seq`` ended holding ``block_ids``. True: keep them until :meth:`get_finished` lists
        ``seq.id`` as sent (the connector still reads them); False: free them now. Default: False."""
        return False

    def get_finished(self) -> tuple[set[str], set[str]]:
        """``(finished_sending, finished_receiving)``: request ids whose send (the engine frees
        the kept blocks) or asynchronous load (the sequence may run) completed since the last
        call. Each id is reported once. Default: nothing."""
        return set(), set()

    def get_step_transfer_time(self) -> KVTransferTime:
        """The link time of the transfers booked since the last call (the step just run reads the
        loads); each second is reported once. Default: none."""
        return NO_TRANSFER

    def transfer_priced(self, added_s: float, hidden_s: float) -> None:
        """The last step's loads (a nonzero :meth:`get_step_transfer_time`) added ``added_s`` to it
        and hid ``hidden_s`` behind its compute. Default: nothing."""

    # ---- worker side (where the KV lives) ------------------------------------------------
    def start_load_kv(self) -> None:
        """Start moving the bytes of every load :meth:`update_state_after_alloc` asked for; called
        before each forward pass. Default: nothing."""

    def wait_for_load(self) -> None:
        """Block until the loads started by :meth:`start_load_kv` that this forward pass reads are
        in place. Default: nothing."""

    def save_kv(self) -> None:
        """Start sending the blocks :meth:`request_finished` kept; called after each step.
        Default: nothing."""

    def wait_for_save(self) -> None:
        """Block until the sends started by :meth:`save_kv` have read their blocks. Default: nothing."""
