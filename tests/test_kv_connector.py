"""KV through a connector (servelab.core.kv_connector): real block contents move between two
engines in one process and the receiving engine's tokens equal one engine's; check-plugin's
disaggregated stage passes for the built-in schedulers and catches one that ignores the
connector; admission asks the allocator without side effects (item 6 of issue 33)."""

from __future__ import annotations

import copy
import random
from dataclasses import replace

import pytest

from servelab.api import compose
from servelab.cluster.simulated import continued
from servelab.core.contexts import AllocatorContext, EvictorContext
from servelab.core.cost_model import StepCostModel
from servelab.core.interfaces import EngineLimits
from servelab.core.kv_connector import KVConnector
from servelab.core.registry import default_registry
from servelab.core.request import Request, Sequence
from servelab.kv.pd.local import LocalKVLink
from servelab.kit import conformance_disagg
from servelab.plugins.allocators.paged import PagedAllocator
from servelab.plugins.evictors.lru import LruEvictor
from servelab.assemble.stack import build_stack

from engine_helpers import drain

REAL = ["model=tiny", "clock=virtual", "time_model=roofline", "hardware=h100", "num_kv_blocks=48",
        "allocator.prefix_caching=true"]


def _requests(n: int, vocab: int, seed: int = 0) -> list[Request]:
    rng = random.Random(seed)
    shared = [rng.randrange(vocab) for _ in range(40)]  # a prefix some prompts share: the decode side caches it
    out = []
    for i in range(n):
        own = [rng.randrange(vocab) for _ in range(rng.randint(3, 50))]
        prompt = (shared + own) if i % 2 else own
        out.append(Request(id=f"r{i}", prompt_token_ids=tuple(prompt), max_tokens=rng.randint(2, 12),
                           arrival_time=0.0))
    return out


def test_real_engines_move_kv_blocks_and_decode_gives_one_engines_tokens():
    cfg = compose(REAL, logger="none", progress=False)
    one = build_stack(cfg)
    vocab = one.executor.spec.vocab_size
    requests = _requests(6, vocab)
    ref = [one.engine.add_request(r, 0.0) for r in requests]
    drain(one.engine)

    link = LocalKVLink()
    sender, receiver = link.endpoint(sends=True), link.endpoint(receives=True)
    prefill = build_stack(compose(REAL, logger="none", progress=False), connector=sender)
    decode = build_stack(compose([*REAL, "num_kv_blocks=20"], logger="none", progress=False), connector=receiver)
    sender.bind(prefill.executor)
    receiver.bind(decode.executor)
    pseqs = [prefill.engine.add_request(replace(r, max_tokens=1), 0.0) for r in requests]
    drain(prefill.engine)
    assert len(link.held) == len(requests)  # every prompt's blocks kept for the hand-off
    for r, pseq in zip(requests, pseqs):
        decode.engine.add_sequence(continued(pseq, r))
    drain(decode.engine)
    prefill.engine.poll_connector()

    got = {s.id: list(s.output_token_ids) for s in decode.engine.sequences.values()}
    assert got == {s.id: list(s.output_token_ids) for s in ref}
    assert decode.engine.totals.prefill_tokens == 0  # no prompt token computed on the decode side
    assert prefill.engine.allocator.leaked_blocks() == 0 and decode.engine.allocator.leaked_blocks() == 0
    assert not link.held


def test_check_plugin_runs_schedulers_on_the_decode_side_of_a_connector():
    registry = default_registry()
    want = conformance_disagg.reference_outputs(registry)
    for scheduler in ("fcfs", "priority", "vtc", "static"):
        assert conformance_disagg.run_disaggregated((f"scheduler={scheduler}",), registry) == want, scheduler


def test_a_scheduler_that_ignores_the_connector_fails_the_disaggregated_stage(monkeypatch):
    from servelab.engine.scheduling import QueueScheduler

    def add_ignoring_the_connector(self, seq):
        self.connector = None  # never asked, at arrival or admission: the KV kept for it is never loaded
        self.waiting.push(seq)

    monkeypatch.setattr(QueueScheduler, "add", add_ignoring_the_connector)
    with pytest.raises(AssertionError, match="still held|never loaded"):
        conformance_disagg.run_disaggregated(("scheduler=fcfs",), default_registry())


def test_the_default_connector_brings_nothing_and_keeps_nothing():
    c = KVConnector()
    seq = Sequence(Request(id="a", prompt_token_ids=(1, 2, 3), max_tokens=2))
    assert c.get_num_new_matched_tokens(seq, 0) == (0, False)
    assert c.request_finished(seq, [0]) is False
    assert c.get_finished() == (set(), set())


# ---- admission without side effects ------------------------------------------------------------

class CountingLru(LruEvictor):
    def __init__(self, *args) -> None:
        super().__init__(*args)
        self.hits = self.releases = 0

    def on_hit(self, block: int) -> None:
        self.hits += 1
        super().on_hit(block)

    def on_release(self, block: int) -> None:
        self.releases += 1
        super().on_release(block)


def _paged(num_blocks: int, block_size: int = 4) -> PagedAllocator:
    limits = EngineLimits(block_size=block_size, max_num_seqs=8, max_num_batched_tokens=64, max_model_len=256,
                          chunked_prefill=True)
    evictor = CountingLru(LruEvictor.Config(), EvictorContext(num_blocks, block_size, StepCostModel()))
    return PagedAllocator(PagedAllocator.Config(prefix_caching=True),
                          AllocatorContext(num_blocks, block_size, limits, evictor))


def _computed(alloc: PagedAllocator, rid: str, tokens: list[int]) -> Sequence:
    seq = Sequence(Request(id=rid, prompt_token_ids=tuple(tokens), max_tokens=4))
    alloc.start_sequence(seq)
    assert alloc.allocate_slots(seq, seq.num_uncomputed_tokens)
    seq.num_computed_tokens = seq.num_tokens  # as the engine's apply would
    alloc.on_tokens_computed(seq)
    return seq


def test_can_allocate_answers_what_admission_would_do_and_touches_nothing():
    rng = random.Random(3)
    for trial in range(200):
        alloc = _paged(num_blocks=rng.randint(6, 16))
        prefixes = [[rng.randrange(5) for _ in range(8)] for _ in range(3)]
        live = []
        for i in range(rng.randint(0, 4)):  # some requests computed; some of them finished (cached blocks)
            tokens = rng.choice(prefixes) + [rng.randrange(5) for _ in range(rng.randint(0, 6))]
            if alloc.num_free_blocks() * 4 < len(tokens) + 4:
                break
            seq = _computed(alloc, f"s{trial}-{i}", tokens)
            (live.append(seq) if rng.random() < 0.5 else alloc.free(seq))
        head = Sequence(Request(id="head", prompt_token_ids=tuple(rng.choice(prefixes) + [1, 2, 3][:rng.randint(1, 3)]),
                                max_tokens=4))
        cached = alloc.cached_prefix_len(head)
        n = rng.randint(1, head.num_tokens - cached)
        before = (alloc.evictor.hits, alloc.evictor.releases, list(alloc.evictor.queue), alloc.num_free_blocks())
        answer = alloc.can_allocate(head, n, cached)
        assert before == (alloc.evictor.hits, alloc.evictor.releases, list(alloc.evictor.queue), alloc.num_free_blocks())
        trial_alloc = copy.deepcopy(alloc)
        trial_head = copy.deepcopy(head)
        trial_alloc.start_sequence(trial_head)
        assert answer == trial_alloc.allocate_slots(trial_head, n), trial


def test_a_head_of_line_request_that_waits_does_not_touch_its_cached_prefix():
    cfg = compose(["backend=sim", "model=llama3_8b", "hardware=h100", "num_kv_blocks=12", "block_size=16",
                   "allocator.prefix_caching=true", "max_num_seqs=4"], logger="none", progress=False)
    stack = build_stack(cfg)
    engine, alloc = stack.engine, stack.engine.allocator
    evictor = alloc.evictor
    hits = []
    original = evictor.on_hit
    alloc._on_hit = lambda block: (hits.append(block), original(block))  # the allocator's bound hook
    shared = tuple(range(1, 33))  # two full blocks
    engine.add_request(Request(id="first", prompt_token_ids=shared + (7,), max_tokens=1))
    drain(engine)  # its two prompt blocks stay cached
    engine.add_request(Request(id="big", prompt_token_ids=tuple(range(100, 200)), max_tokens=60))
    engine.add_request(Request(id="head", prompt_token_ids=shared + tuple(range(300, 360)), max_tokens=8))
    steps = 0
    while engine.sequences["head"].num_computed_tokens == 0 and steps < 200:
        engine.step()
        steps += 1
    assert steps > 3  # it waited several steps behind "big" for blocks
    assert len(hits) == 2  # its two cached blocks were referenced once: when it was admitted, not per retry
    drain(engine)
    assert engine.sequences["head"].num_cached_prompt_tokens == 32
    assert alloc.leaked_blocks() == 0
