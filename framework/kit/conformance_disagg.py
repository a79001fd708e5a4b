"""``check-plugin scheduler=<x>``: the disaggregated path, where a request's KV arrives through a
KV connector (:mod:`servelab.core.kv_connector`) instead of being computed.

A prefill engine (the default stack) computes each request's prompt and first token and keeps
the KV (its connector's ``request_finished``); the scheduler under test runs a decode engine with
a small pool, is handed each request's continuation at once (``Engine.add_sequence``), and must
learn from its connector that the prompt's KV is held elsewhere, allocate through its allocator
when the pool allows (back-pressure), let the load land (some loads report asynchronously,
several steps later, in any order) and then decode. Both engines run
:class:`~servelab.kit.testing.KVCheckingExecutor`, whose tokens are a function of the KV it reads
back, and the connector copies those fake KV slots: a sequence scheduled before its KV landed,
KV written to the wrong blocks, or a prompt recomputed over the loaded KV changes the tokens or
raises. Contract: every request ends with the tokens one engine gives it, no block stays held
on either engine, and the scheduler holds nothing afterwards.
"""

from __future__ import annotations

import random
from typing import TYPE_CHECKING, Any, Sequence as Seq

from servelab.core.kv_connector import KVConnector
from servelab.core.request import Request, Sequence, Status
from servelab.kit.testing import copy_kv_blocks

if TYPE_CHECKING:
    from servelab.kit.conformance import Failure, KitRun

CONTRACT = "kv through a connector"
CONTRACT_TEXT = ("a scheduler seats a request whose KV a connector loads (prefill/decode) only once it "
                 "landed, waits for blocks when the pool refuses, and its tokens equal one engine's; no block "
                 "stays held on either side")
DECODE_BLOCKS = 14  # a pool that holds about three of the requests below at once: loads wait for blocks
NUM_REQUESTS = 12
MAX_STEPS = 5_000


class _Link:
    """The kit's prefill -> decode link: the prefill side's kept blocks, by request id."""

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.held: dict[str, tuple["_Connector", list[int], int]] = {}


class _Connector(KVConnector):
    """A KV connector over two KVCheckingExecutors: copies their fake KV slots."""

    name = "kit"

    def __init__(self, link: _Link, sends: bool) -> None:
        self.link, self.sends = link, sends
        self.executor: Any = None  # the KVCheckingExecutor, set once the stack is built
        self.sent: set[str] = set()
        self.received: set[str] = set()
        self._loads: list[list] = []  # [request id, sender, pairs, polls left (None: synchronous)]

    def get_num_new_matched_tokens(self, seq: Sequence, num_computed_tokens: int) -> tuple[int, bool]:
        held = None if self.sends else self.link.held.get(seq.id)
        if held is None:
            return 0, False
        return held[2] - num_computed_tokens, self.get_async(seq)

    def update_state_after_alloc(self, seq: Sequence, block_ids: Seq[int], num_external_tokens: int) -> None:
        if seq.id not in self.link.held:  # an admission with nothing to load
            return
        sender, src, _ = self.link.held.pop(seq.id)
        bs = self.executor.block_size
        first, last = seq.num_computed_tokens // bs, -(-(seq.num_computed_tokens + num_external_tokens) // bs)
        pairs = [(src[j], block_ids[j]) for j in range(first, last)]
        polls = None if not self.get_async(seq) else self.link.rng.randint(1, 4)
        self._loads.append([seq.id, sender, pairs, polls])

    @staticmethod
    def get_async(seq: Sequence) -> bool:
        """Every third request loads synchronously (before the next forward pass), the rest land later."""
        return int(seq.id.rsplit("-", 1)[-1]) % 3 != 0

    def request_finished(self, seq: Sequence, block_ids: Seq[int]) -> bool:
        if not self.sends or seq.status is not Status.FINISHED or seq.finish_reason != "length":
            return False
        self.link.held[seq.id] = (self, list(block_ids), seq.num_computed_tokens)
        return True

    def get_finished(self) -> tuple[set[str], set[str]]:
        for load in list(self._loads):  # asynchronous loads land after a few polls
            if load[3] is not None:
                load[3] -= 1
                if load[3] <= 0:
                    self._copy(load)
                    self.received.add(load[0])
        sent, received, self.sent, self.received = self.sent, self.received, set(), set()
        return sent, received

    def start_load_kv(self) -> None:
        for load in [x for x in self._loads if x[3] is None]:
            self._copy(load)

    def _copy(self, load: list) -> None:
        request_id, sender, pairs, _ = load
        self._loads.remove(load)
        copy_kv_blocks(pairs, sender.executor.device_kv, self.executor.device_kv, self.executor.block_size)
        sender.sent.add(request_id)


def _requests(rng: random.Random, vocab: int) -> list[Request]:
    out = []
    for i in range(NUM_REQUESTS):
        prompt = [rng.randrange(vocab) for _ in range(rng.randint(4, 40))]
        out.append(Request(id=f"kv-{i}", arrival_time=0.01 * i, prompt_token_ids=tuple(prompt),
                           max_tokens=rng.randint(1, 14), ignore_eos=True))
    return out


def _stack(overrides: tuple[str, ...], registry, num_blocks: int, connector: _Connector | None):
    from servelab.kit.conformance import _compose, merge_overrides  # noqa: PLC0415 - the kit's composition
    from servelab.kit.conformance_cases import VOCAB  # noqa: PLC0415
    from servelab.kit.testing import KVCheckingExecutor, VirtualClock  # noqa: PLC0415 - torch
    from servelab.assemble.stack import build_stack  # noqa: PLC0415 - torch

    cfg = _compose(merge_overrides(("model=tiny",), overrides))
    clock = VirtualClock()
    executor = KVCheckingExecutor(clock, num_blocks, cfg.block_size, vocab_size=VOCAB, max_positions=cfg.max_model_len)
    stack = build_stack(cfg, registry, executor=executor, clock=clock, connector=connector)
    if connector is not None:
        connector.executor = executor
    stack.engine.keep_steps = False
    return stack, clock


def _drain(engine, clock, what: str) -> None:
    for _ in range(MAX_STEPS):
        if not engine.has_unfinished():
            return
        if engine.step() is None:
            clock.sleep(0.001)
    raise AssertionError(f"progress: the {what} engine did not finish within {MAX_STEPS} steps "
                         f"(queues {engine.scheduler.queue_lengths()})")


def run_disaggregated(overrides: tuple[str, ...], registry, seed: int = 0) -> dict[str, list[int]]:
    """Run the kit's requests prefill -> decode (the decode engine built with ``overrides``) and
    return each request's output tokens; raises AssertionError naming what broke."""
    from dataclasses import replace  # noqa: PLC0415

    from servelab.cluster.simulated import continued  # noqa: PLC0415 - the continuation a decode engine gets
    from servelab.kit.conformance_cases import VOCAB  # noqa: PLC0415

    rng = random.Random(seed)
    link = _Link(rng)
    requests = _requests(rng, VOCAB)
    sender, receiver = _Connector(link, sends=True), _Connector(link, sends=False)
    prefill, p_clock = _stack((), registry, 256, sender)
    decode, d_clock = _stack(overrides, registry, DECODE_BLOCKS, receiver)
    prefill_seqs = [prefill.engine.add_request(replace(r, max_tokens=1), 0.0) for r in requests]
    _drain(prefill.engine, p_clock, "prefill")
    outputs: dict[str, list[int]] = {}
    for r, pseq in zip(requests, prefill_seqs):
        if pseq.id in link.held:
            decode.engine.add_sequence(continued(pseq, r))
        else:
            outputs[r.id] = list(pseq.output_token_ids)
    _drain(decode.engine, d_clock, "decode")
    prefill.engine.poll_connector()  # the last sends reported
    for seq in decode.engine.sequences.values():
        if seq.status is not Status.FINISHED:
            raise AssertionError(f"request {seq.id!r} ended {seq.status.value} on the decode engine")
        outputs[seq.id] = list(seq.output_token_ids)
    for name, stack in (("prefill", prefill), ("decode", decode)):
        leaked = stack.engine.allocator.leaked_blocks()
        if leaked:
            raise AssertionError(f"{leaked} blocks still held on the {name} engine after every request ended")
    if decode.engine.scheduler.num_unfinished():
        raise AssertionError(f"the decode scheduler still holds {decode.engine.scheduler.num_unfinished()} sequences")
    if link.held:
        raise AssertionError(f"KV of {sorted(link.held)} was kept for a decode engine that never loaded it")
    return outputs


def reference_outputs(registry, seed: int = 0) -> dict[str, list[int]]:
    """The same requests on one engine (the default stack)."""
    from servelab.kit.conformance_cases import VOCAB  # noqa: PLC0415

    rng = random.Random(seed)
    requests = _requests(rng, VOCAB)
    stack, clock = _stack((), registry, 256, None)
    seqs = [stack.engine.add_request(r, 0.0) for r in requests]
    _drain(stack.engine, clock, "reference")
    return {s.id: list(s.output_token_ids) for s in seqs}


def check_disaggregated(run: "KitRun") -> "Failure | None":
    """The kit's stage: the scheduler ``run.name`` on the decode side of a prefill/decode pair
    (skipped while an earlier stage failed: one root cause at a time)."""
    if run.report.failures:
        return None
    from servelab.kit.conformance import CONTRACTS, Failure, merge_overrides  # noqa: PLC0415

    CONTRACTS.setdefault(CONTRACT, CONTRACT_TEXT)
    overrides = merge_overrides((f"{run.kind}={run.name}",), run.extra)
    try:
        got = run_disaggregated(overrides, run.registry, run.seed)
        want = reference_outputs(run.registry, run.seed)
    except Exception as exc:  # noqa: BLE001 - every way the run breaks is this contract
        return Failure(CONTRACT, f"{type(exc).__name__}: {exc} (decode engine: {' '.join(overrides)}, "
                       f"pool of {DECODE_BLOCKS} blocks)")
    wrong = sorted(rid for rid in want if got.get(rid) != want[rid])
    if wrong:
        rid = wrong[0]
        return Failure(CONTRACT, f"{len(wrong)} requests got other tokens than on one engine, e.g. {rid!r}: "
                       f"{got.get(rid)} vs {want[rid]} (decode engine: {' '.join(overrides)})")
    run.report.notes.append(f"disaggregated: KV of {NUM_REQUESTS} requests handed prefill -> decode through a KV "
                            f"connector, decode pool of {DECODE_BLOCKS} blocks")
    return None
