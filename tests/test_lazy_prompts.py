"""Random prompts made when first read (servelab.workloads.lazy_prompts): the same ids as drawing them
all up front, in whatever order they are read; a pass over a workload's lengths draws none."""

from __future__ import annotations

import pickle
import random

import numpy as np

from servelab.api import compose
from servelab.workloads import lazy_prompts
from servelab.workloads.build import build_requests
from servelab.workloads.lazy_prompts import LazyPrompt, PromptDraws

VOCAB = 1000


def _eager(seed: int, plan) -> list[tuple[int, ...]]:
    """The prompts drawn up front: each request's draws in order, its prompt the last one."""
    gens = [np.random.default_rng(seed + g) for g in range(2)]
    out = []
    for draws in plan:
        ids = ()
        for g, length in draws:
            ids = tuple(gens[g].integers(0, VOCAB, size=length).tolist())
        out.append(ids)
    return out


def test_any_read_order_gives_the_up_front_prompts(monkeypatch):
    monkeypatch.setattr(lazy_prompts, "EVERY", 4)  # many saved copies: reads behind the cursor use them
    monkeypatch.setattr(lazy_prompts, "RECENT", 2)
    rng = random.Random(0)
    plan = [((0, rng.randint(0, 9)),) if rng.random() < 0.7 else ((0, rng.randint(1, 9)), (1, rng.randint(1, 5)))
            for _ in range(40)]
    expected = _eager(7, plan)
    for order in (list(range(40)), list(range(39, -1, -1)), rng.sample(range(40), 40)):
        draws = PromptDraws([np.random.default_rng(7), np.random.default_rng(8)], plan.__getitem__, VOCAB)
        got = {i: LazyPrompt(draws, i, plan[i][-1][1]).ids() for i in order}
        again = {i: LazyPrompt(draws, i, plan[i][-1][1]).ids() for i in reversed(order)}
        assert [got[i] for i in range(40)] == [again[i] for i in range(40)] == expected


def test_a_lazy_prompt_reads_as_its_tuple():
    draws = PromptDraws([np.random.default_rng(1)], lambda i: ((0, 5),), VOCAB)
    prompt = LazyPrompt(draws, 0, 5)
    assert len(prompt) == 5 and draws._next == 0  # its length draws nothing
    ids = prompt.ids()
    assert prompt == ids and hash(prompt) == hash(ids) and prompt[1:3] == ids[1:3] and isinstance(prompt[1:3], tuple)
    assert list(prompt) == list(ids) and prompt + (7,) == ids + (7,) and np.array_equal(np.asarray(prompt), ids)
    assert pickle.loads(pickle.dumps(prompt)) == ids and type(pickle.loads(pickle.dumps(prompt))) is tuple


def test_a_pass_over_a_workloads_lengths_draws_no_token():
    for overrides in (["workload.num_requests=50"],
                      ["workload=trace", "workload.path=azure_conv", "workload.sample=resample", "workload.num_requests=50"]):
        cfg = compose(["backend=sim", "model=llama3_8b", *overrides], logger="none")
        requests = build_requests(cfg.workload, 128256, 4096)
        assert sum(r.prompt_len for r in requests) > 0
        assert next(iter(requests)).prompt_token_ids._draws._next == 0  # nothing drawn
        first = next(iter(requests))
        assert len(tuple(first.prompt_token_ids)) == first.prompt_len


def test_a_simulated_run_that_reads_no_prompt_draws_none(tmp_path):
    """The engine's sequences copy no prompt (``Sequence.token_ids`` is made when first read): a run
    on the simulator without prefix caching never draws a lazy workload's ids."""
    from servelab.run.session import run_job

    cfg = compose(["backend=sim", "model=llama3_8b", "workload.num_requests=30", "workload.rate=50"], logger="none",
                  progress=False)
    drawn: list[int] = []
    original = PromptDraws.prompt
    try:
        PromptDraws.prompt = lambda self, i: drawn.append(i) or original(self, i)  # type: ignore[method-assign]
        result = run_job(cfg, tmp_path)
    finally:
        PromptDraws.prompt = original  # type: ignore[method-assign]
    assert result.summary["num_requests"] == 30 and drawn == []


def test_a_sequence_reads_prompt_and_outputs_whenever_first_read():
    from servelab.core.request import Request, Sequence

    for read_at in range(4):  # token_ids first read before any output, between appends, after the end
        seq = Sequence(Request("r", (5, 6, 7), 3))
        views = []
        for k, token in enumerate((8, 9, 10)):
            if k == read_at:
                views.append(seq.token_ids)
            seq.append_token(token, float(k)) if k != 1 else seq.append_repeated(token, [float(k)])
            assert seq.num_tokens == 4 + k
        seq.finish("length", 3.0)
        if read_at == 3:
            views.append(seq.token_ids)
        seq.compact()
        assert [list(v) for v in views] == [[5, 6, 7, 8, 9, 10]] and list(seq.token_ids) == [5, 6, 7, 8, 9, 10]
        assert seq.token_ids[3:] == [8, 9, 10] and seq.num_tokens == 6
