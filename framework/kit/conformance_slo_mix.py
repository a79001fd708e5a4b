"""``check-plugin scheduler=<x>``: fixed scenarios with mixed SLO classes, so that an order that reads
the targets (deadlines, slack, lateness) or the priorities is exercised, not only arrival order.

The random scenarios (:mod:`servelab.kit.conformance_cases`) give a few requests a target each; here
every request belongs to one of :data:`SLO_CLASSES` — a tight class (a TTFT of a few fake-executor
steps, a TPOT of about one), a loose one and one without targets — and carries a priority. They
arrive in bursts, the tight ones last in each burst, into a pool that holds about 2.5 of them, so
a deadline-aware scheduler admits out of arrival order and preempts, and tight requests turn late
(their deadline passed) while they wait. The contracts are the random scenarios' (budget, seats,
blocks, victims, KV integrity, every request ends, no leak, tokens equal the default stack's, the
scenario again with aborts, state left behind), checked by the same code.
"""

from __future__ import annotations

import random

from servelab.core.request import Request
from servelab.kit.conformance_cases import VOCAB, Scenario

#: ``(name, share, ttft_slo_ms, tpot_slo_ms, priority)``: the fake executor's step takes ~5-12 ms.
SLO_CLASSES = (("tight", 0.4, 40.0, 10.0, 0), ("loose", 0.4, 500.0, 60.0, 1), ("none", 0.2, None, None, 2))
SLO_MIX_SEEDS = (0, 1, 2)  # chunked prefill on, off, on with a host swap pool
MAX_MODEL_LEN, BLOCK_SIZE = 64, 4


def slo_mix_scenario(seed: int, scheduler: str) -> Scenario:
    """Scenario ``seed`` of :data:`SLO_MIX_SEEDS` with ``scheduler=<scheduler>``: 3 bursts of 6 requests,
    each request's class drawn by share (the tight ones moved to the end of their burst)."""
    rng = random.Random(f"slo-mix-{seed}")
    chunked = seed != 1
    requests: list[Request] = []
    for burst in range(3):
        drawn = rng.choices(SLO_CLASSES, weights=[c[1] for c in SLO_CLASSES], k=6)
        drawn.sort(key=lambda c: c[0] == "tight")  # tight last: a deadline order must reach past the others
        for i, (name, _, ttft, tpot, priority) in enumerate(drawn):
            prompt = tuple(rng.randrange(1, VOCAB) for _ in range(rng.randint(6, 36)))
            requests.append(Request(f"{name}-{burst}-{i}", prompt, rng.randint(4, 16),
                                    arrival_time=0.03 * burst + 0.001 * i, priority=priority,
                                    ttft_slo_ms=ttft, tpot_slo_ms=tpot, slo_class=name))
    blocks = [-(-(r.prompt_len + r.max_tokens) // BLOCK_SIZE) for r in requests]
    overrides = (f"scheduler={scheduler}", "allocator=paged", f"preemption={'swap' if seed == 2 else 'recompute'}",
                 f"block_size={BLOCK_SIZE}", f"chunked_prefill={str(chunked).lower()}", f"max_model_len={MAX_MODEL_LEN}",
                 "max_num_seqs=4", f"max_num_batched_tokens={32 if chunked else MAX_MODEL_LEN}",
                 "allocator.prefix_caching=false")
    num_blocks = max(max(blocks) + 1, 5 * sum(blocks) // (2 * len(blocks)))  # ~2.5 of the 4 seats' requests
    return Scenario(seed, overrides, MAX_MODEL_LEN, num_blocks, 16 if seed == 2 else 0, requests)
