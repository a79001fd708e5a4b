"""The scheduler asks the KV tiers in its own order (issue 44, item 3): a tier hit is admitted when
the policy reaches it, not ahead of it, and a request preempted by recompute reloads its prefix."""

from __future__ import annotations

from conftest import compose
from servelab.assemble.stack import build_stack
from servelab.core.request import Request, Status
from servelab.kv.tiers.figures import kv_tier_figures

# a tiny model on the simulator; 24 GPU blocks of 16 tokens: a 320-token prompt evicts an earlier one
SIM = ("backend=sim", "model=tiny_code", "block_size=16", "num_kv_blocks=24", "kv_tiers=host",
       "kv_tier_policy=write_back", "logger=none")


def _prompt(base: int, n: int) -> tuple[int, ...]:
    return tuple((base + i) % 250 for i in range(n))


def _drain(engine) -> None:
    while engine.has_unfinished():
        engine.step()


def _spilled(engine, prompt: tuple[int, ...]) -> None:
    """Run ``prompt`` once, then a prompt that takes the whole pool: the first one's blocks go to the host."""
    engine.add_request(Request(id="warm", prompt_token_ids=prompt, max_tokens=1), 0.0)
    _drain(engine)
    engine.add_request(Request(id="flush", prompt_token_ids=_prompt(120, 360), max_tokens=1), 0.0)
    _drain(engine)


def test_a_high_priority_miss_is_admitted_before_a_low_priority_tier_hit():
    stack = build_stack(compose(*SIM, "scheduler=priority", "max_num_seqs=1"))
    engine, store = stack.engine, stack.engine.connector
    held = _prompt(1, 129)
    _spilled(engine, held)
    warm = engine.sequences["warm"]
    assert store.get_num_new_matched_tokens(warm, engine.allocator.cached_prefix_len(warm))[0] > 0  # spilled
    t = engine.now()
    low = engine.add_request(Request(id="low", prompt_token_ids=held, max_tokens=4, priority=5), t)
    high = engine.add_request(Request(id="high", prompt_token_ids=_prompt(200, 64), max_tokens=4, priority=0), t)
    engine.step()
    assert high.status is Status.RUNNING and low.status is Status.WAITING  # one seat: the policy's choice
    _drain(engine)
    assert low.first_scheduled_time > high.first_scheduled_time and low.num_preemptions == 0
    assert store.loads == 1 and sum(store.hit_blocks) > 0  # low still loaded its prefix from the host
    assert store.leaked() == 0 and engine.allocator.leaked_blocks() == 0


def test_a_request_preempted_by_recompute_reloads_its_prefix_from_the_host():
    stack = build_stack(compose(*SIM, "preemption=recompute"))
    engine, store = stack.engine, stack.engine.connector
    first = engine.add_request(Request(id="a", prompt_token_ids=_prompt(1, 161), max_tokens=150), 0.0)
    while first.num_output_tokens < 4:  # its prompt is computed and its full blocks cached
        engine.step()
    # a second request whose growth takes the pool: one of the two is preempted and its blocks spilled
    engine.add_request(Request(id="b", prompt_token_ids=_prompt(150, 161), max_tokens=150), engine.now())
    _drain(engine)
    preempted = [s for s in engine.sequences.values() if s.num_preemptions]
    assert preempted, "the pool was meant to force a preemption"
    assert store.reloads >= 1 and sum(store.reload_blocks) > 0
    figures = kv_tier_figures(store)  # summary.json
    assert figures["kv_tier_requests_reloaded"] == store.reloads
    assert figures["kv_tiers"][0]["read_bytes"] == (store.hit_blocks[0] + store.reload_blocks[0]) * store.bytes_per_block
    assert store.leaked() == 0 and engine.allocator.leaked_blocks() == 0
