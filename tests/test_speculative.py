"""Speculative decoding: drafts never change what is generated, only how many steps it takes.

On the KV-checking fake executor (which samples from the KV it reads back), an oracle drafter
with injected mistakes drafts for random workloads x every scheduler x allocator x preemption x
prefix caching x chunked prefill x block size on pools small enough to preempt mid-speculation:
tokens equal ``drafter=none`` and no block leaks. On the shipped trained model, greedy outputs
with ``ngram`` and ``draft_model`` equal HF transformers' ``generate``; seeded sampling with
drafts is reproducible; and rejection sampling leaves the target's distribution unchanged.
"""

from __future__ import annotations

import logging
import os
import random

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

from conftest import compose, serve_tiny_code
from memory_helpers import VOCAB, fake_stack, run_requests, tokens_by_id, workloads
from servelab.plugin_api import DrafterContext
from servelab.core.batch import StepBatch
from servelab.core.errors import ConfigError
from servelab.core.interfaces import SpeculativeDrafter
from servelab.plugins.drafters.ngram import prompt_lookup
from servelab.core.request import Request, SamplingParams
from servelab.exec.sampler import sample_and_verify, target_probs
from servelab.assemble.stack import build_stack

settings.register_profile("spec_ci", max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("spec_long", max_examples=1000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
PROFILE = "spec_long" if os.environ.get("SERVELAB_HYPOTHESIS_PROFILE") == "long" else "spec_ci"
MAX_MODEL_LEN = 128


class OracleDrafter(SpeculativeDrafter):
    """Knows what :class:`KVCheckingExecutor` will sample (a hash of the context) and drafts it,
    with a seeded chance of a wrong token at each position: every acceptance length happens."""

    name = "oracle"

    def __init__(self, k: int, error_rate: float, seed: int = 0, always_k: bool = False) -> None:
        super().__init__(None, None)
        self.k, self.error_rate, self.rng, self.always_k = k, error_rate, random.Random(seed), always_k
        self.verified = 0

    @property
    def num_speculative_tokens(self) -> int:
        return self.k

    def propose(self, seqs, k):
        out = []
        for seq in seqs:
            context, drafts = list(seq.token_ids), []
            for _ in range(k if self.always_k else self.rng.randint(0, k)):
                token = hash(tuple(context)) % VOCAB
                if self.rng.random() < self.error_rate:
                    token = (token + 1) % VOCAB
                drafts.append(token)
                context.append(token)
            out.append(drafts)
        return out

    def on_verified(self, seq, num_drafts, num_accepted):
        assert 0 <= num_accepted <= num_drafts <= self.k
        self.verified += 1


def with_drafter(stack, drafter):
    drafter.executor, drafter.allocator = stack.executor, stack.engine.allocator
    stack.engine.drafter = drafter
    return stack


@st.composite
def stacks(draw):
    allocator = draw(st.sampled_from(["paged", "paged", "contiguous"]))
    chunked = draw(st.booleans())
    overrides = [
        f"scheduler={draw(st.sampled_from(['fcfs', 'static', 'priority', 'slo_aware']))}",
        f"allocator={allocator}",
        f"preemption={draw(st.sampled_from(['recompute', 'swap', 'adaptive']))}",
        f"block_size={draw(st.sampled_from([1, 4, 16]))}",
        f"chunked_prefill={str(chunked).lower()}",
        f"max_model_len={MAX_MODEL_LEN}", "max_num_seqs=8",
        f"max_num_batched_tokens={draw(st.sampled_from([16, 32, MAX_MODEL_LEN])) if chunked else MAX_MODEL_LEN}",
    ]
    if allocator == "paged":
        overrides.append(f"allocator.prefix_caching={str(draw(st.booleans())).lower()}")
    return overrides, draw(st.floats(0.3, 1.2)), draw(st.sampled_from([0, 8, 64])), draw(st.integers(1, 8)), \
        draw(st.sampled_from([0.0, 0.2, 0.6, 1.0]))


def _reference(requests):
    return tokens_by_id(run_requests(fake_stack([f"max_model_len={MAX_MODEL_LEN}", "block_size=16",
                                                 f"max_num_batched_tokens={MAX_MODEL_LEN}"], 512), requests))


@settings(settings.get_profile(PROFILE))
@given(requests=workloads(max_tokens=24, classes=True), spec=stacks())
def test_drafts_never_change_tokens_on_any_stack(requests, spec):
    overrides, pool_factor, swap_blocks, k, error_rate = spec
    block_size = int(next(o for o in overrides if o.startswith("block_size=")).split("=")[1])
    largest = max(-(-(r.prompt_len + r.max_tokens) // block_size) for r in requests)
    total = sum(-(-(r.prompt_len + r.max_tokens) // block_size) for r in requests)
    num_blocks = max(1, int(round(pool_factor * max(largest, total // 3))))
    drafter = OracleDrafter(k, error_rate)
    stack = with_drafter(fake_stack(overrides, num_blocks, swap_blocks), drafter)
    result = run_requests(stack, requests)
    expected = _reference(requests)
    for rec in result.requests:
        if rec["rejected_reason"] is None:
            assert rec["finish_reason"] == "length", rec
            assert rec["output_token_ids"] == expected[rec["id"]], (rec["id"], overrides, k, error_rate)
            assert rec["num_accepted_tokens"] <= rec["num_draft_tokens"]
    assert result.summary["leaked_blocks"] == 0
    alloc = stack.engine.allocator
    if hasattr(alloc, "ref_counts"):
        assert all(r == 0 for r in alloc.ref_counts)


def test_preemption_in_the_middle_of_speculation_keeps_tokens():
    """A pool that preempts while sequences verify drafts: swap and recompute both restore them."""
    requests = [Request(f"r{i}", tuple(range(i * 7, i * 7 + 24)), 40) for i in range(6)]
    expected = _reference(requests)
    for preemption, swap in (("recompute", 0), ("swap", 64)):
        drafter = OracleDrafter(4, 0.3)
        stack = with_drafter(fake_stack([f"preemption={preemption}", "block_size=4", f"max_model_len={MAX_MODEL_LEN}"],
                                        40, swap), drafter)
        result = run_requests(stack, requests)
        assert tokens_by_id(result) == expected
        s = result.summary
        assert s["num_preemptions"] > 0 and s["leaked_blocks"] == 0
        assert s["num_draft_tokens"] > s["num_accepted_tokens"] > 0
        assert 1.0 < s["spec_mean_tokens_per_verify"] <= 5.0
        assert len(s["spec_accepted_by_position"]) == 4
        assert sum(r.draft_tokens for r in stack.engine.steps) == s["num_draft_tokens"]
        # speculation pays on the fake executor: fewer steps than one token each
        assert s["num_steps"] < sum(r.max_tokens for r in requests)


def test_rejected_drafts_give_their_blocks_back():
    """After a verify step that rejects everything, the table covers only the verified tokens."""
    drafter = OracleDrafter(8, 1.0, always_k=True)  # every first draft wrong
    stack = with_drafter(fake_stack(["block_size=2", f"max_model_len={MAX_MODEL_LEN}"], 64), drafter)
    engine = stack.engine
    engine.add_request(Request("a", (1, 2, 3), 20))
    engine.step()  # prefill: samples token 4's successor and drafts 8
    seq = engine.sequences["a"]
    assert len(seq.draft_token_ids) == 8
    record = engine.step()  # verify 1 + 8 tokens (9 slots reserved), keep none
    assert record.draft_tokens == 8 and record.accepted_tokens == 0
    assert seq.num_computed_tokens == 4 and seq.num_tokens == 5
    assert len(engine.allocator.block_table("a")) == 2  # ceil(4 / 2): the 3 blocks past it went back


def test_the_property_can_fail(monkeypatch):
    """A verifier that keeps drafts the target disagreed with changes the outputs, and is caught."""
    import servelab.kit.testing

    def keep_every_draft(row_tokens, batch):
        tokens, accepted, row = [], [], 0
        for d, drafts in zip(batch.num_drafts, batch.draft_token_ids):
            tokens += list(drafts) + [row_tokens[row + d]]
            accepted.append(d)
            row += d + 1
        return (tokens, accepted) if batch.has_drafts else (row_tokens, None)

    requests = [Request(f"r{i}", tuple(range(i * 5, i * 5 + 12)), 16) for i in range(3)]
    expected = _reference(requests)
    monkeypatch.setattr(servelab.kit.testing, "verify_row_tokens", keep_every_draft)
    stack = with_drafter(fake_stack(["block_size=4", f"max_model_len={MAX_MODEL_LEN}"], 64), OracleDrafter(4, 0.5))
    assert tokens_by_id(run_requests(stack, requests)) != expected


class UnrulyDrafter(SpeculativeDrafter):
    """Returns too many drafts and ids outside the vocabulary."""

    name = "unruly"

    @property
    def num_speculative_tokens(self) -> int:
        return 2

    def propose(self, seqs, k):
        return [[1, 2, 3, 4, 5] if i % 2 == 0 else [VOCAB + 7, 1] for i in range(len(seqs))]


def test_a_drafter_that_breaks_its_contract_is_truncated_with_a_warning(caplog):
    requests = [Request(f"r{i}", tuple(range(i, i + 9)), 12) for i in range(3)]
    expected = _reference(requests)
    drafter = UnrulyDrafter(None, DrafterContext(None))
    stack = with_drafter(fake_stack([f"max_model_len={MAX_MODEL_LEN}"], 64), drafter)
    with caplog.at_level(logging.WARNING):
        result = run_requests(stack, requests)
    assert tokens_by_id(result) == expected and result.summary["leaked_blocks"] == 0
    text = caplog.text
    assert "drafter 'unruly' proposed 5 drafts" in text and "more than drafter.k=2" in text
    assert f"outside the vocabulary [0, {VOCAB})" in text


# ---- ngram ---------------------------------------------------------------------------------

def _lookup_reference(tokens: list[int], min_n: int, max_n: int, k: int) -> list[int]:
    n_tok = len(tokens)
    for n in range(max_n, min_n - 1, -1):
        if n > n_tok:
            continue
        suffix = tokens[n_tok - n:]
        for end in range(n_tok - 2, n - 2, -1):  # latest earlier occurrence ending at `end`
            if tokens[end - n + 1:end + 1] == suffix:
                return tokens[end + 1:end + 1 + k]
    return []


@settings(max_examples=200, deadline=None)
@given(seqs=st.lists(st.lists(st.integers(0, 5), min_size=1, max_size=40), min_size=1, max_size=6),
       min_n=st.integers(1, 3), extra=st.integers(0, 2), k=st.integers(1, 6))
def test_prompt_lookup_matches_a_brute_force_search(seqs, min_n, extra, k):
    lens = np.array([len(s) for s in seqs])
    table = np.full((len(seqs), lens.max()), -1, dtype=np.int64)
    for i, s in enumerate(seqs):
        table[i, :len(s)] = s
    got = prompt_lookup(table, lens, min_n, min_n + extra, k)
    assert got == [_lookup_reference(s, min_n, min_n + extra, k) for s in seqs]


# ---- rejection sampling ------------------------------------------------------------------------

def _batch(drafts, q, params, seeds):
    d = len(drafts)
    return StepBatch(input_ids=torch.zeros(d + 1, dtype=torch.long), positions=torch.zeros(d + 1, dtype=torch.long),
                     slot_mapping=torch.zeros(d + 1, dtype=torch.long), block_tables=torch.zeros(1, 1, dtype=torch.int32),
                     cu_seqlens_q=torch.tensor([0, d + 1], dtype=torch.int32), context_lens=torch.tensor([d + 1]),
                     max_query_len=d + 1, max_context_len=d + 1, sample_rows=torch.arange(d + 1),
                     sampling=[params] * (d + 1), sample_seeds=seeds, num_drafts=[d], draft_token_ids=[drafts],
                     draft_probs=[q])


@pytest.mark.parametrize("draft_dist", ["one_hot", pytest.param("model", marks=pytest.mark.slow)])  # same test, twins
def test_rejection_sampling_leaves_the_target_distribution(draft_dist):
    """Over 20,000 seeds the first token follows p0, and once draft 0 is kept the next follows p1
    (within 0.015 absolute: > 4 standard deviations at this sample size). Drafts are drawn from
    q (the drafter's distribution), or fixed for one-hot drafts as ngram's."""
    gen = torch.Generator().manual_seed(0)
    rng = np.random.default_rng(0)
    vocab, params = 6, SamplingParams(temperature=1.0)
    logits = torch.randn(3, vocab, generator=gen) * 1.5
    p = torch.stack([target_probs(row, params) for row in logits])
    q = torch.softmax(torch.randn(2, vocab, generator=gen), -1) if draft_dist == "model" else None
    q_np = None if q is None else [row / row.sum() for row in q.double().numpy()]
    first = np.zeros(vocab)
    second = np.zeros(vocab)
    trials = 20_000
    for t in range(trials):
        drafts = [int(torch.argmax(p[0])), 2] if q is None else [int(rng.choice(vocab, p=q_np[i])) for i in range(2)]
        tokens, accepted = sample_and_verify(logits, _batch(drafts, q, params, [3 * t, 3 * t + 1, 3 * t + 2]))
        assert len(tokens) == accepted[0] + 1
        first[tokens[0]] += 1
        if accepted[0] >= 1:
            second[tokens[1]] += 1
    assert np.abs(first / trials - p[0].numpy()).max() < 0.015
    assert second.sum() > 2000
    assert np.abs(second / second.sum() - p[1].numpy()).max() < 0.015 * np.sqrt(trials / second.sum())


def test_greedy_verification_keeps_the_agreeing_prefix_and_the_target_token():
    logits = torch.full((4, 5), -10.0)
    for row, token in enumerate([3, 1, 4, 2]):
        logits[row, token] = 0.0
    tokens, accepted = sample_and_verify(logits, _batch([3, 1, 0], None, None, [0, 0, 0, 0]))
    assert tokens == [3, 1, 4] and accepted == [2]
    tokens, accepted = sample_and_verify(logits, _batch([3, 1, 4], None, None, [0, 0, 0, 0]))
    assert tokens == [3, 1, 4, 2] and accepted == [3]  # all kept, plus the bonus token


# ---- the real (trained) model ---------------------------------------------------------------

_serve = serve_tiny_code


@pytest.fixture(scope="module")
def heldout():
    from test_trained_models import heldout_prompts, hf_generate
    from servelab.core.packaged import PACKAGED_CHECKPOINTS

    prompts, max_tokens = heldout_prompts(12, seed=3)
    return prompts, max_tokens, hf_generate(PACKAGED_CHECKPOINTS / "tiny_code", prompts, max_tokens)


@pytest.mark.parametrize("drafter", ["drafter=ngram", "drafter=draft_model"])
@pytest.mark.parametrize("variant", [[], ["block_size=16", "num_kv_blocks=20"]], ids=["roomy", "preempting"])
def test_greedy_with_drafts_equals_hf(heldout, drafter, variant):
    prompts, max_tokens, expected = heldout
    result = _serve(prompts, max_tokens, drafter, "drafter.k=4", *variant)
    assert [r["output_token_ids"] for r in result.requests] == expected
    s = result.summary
    assert s["leaked_blocks"] == 0 and s["num_draft_tokens"] > 0 and s["num_accepted_tokens"] > 0
    if variant:
        assert s["num_preemptions"] > 0


@pytest.mark.slow
@pytest.mark.parametrize("drafter", ["drafter=ngram", "drafter=draft_model"])
@pytest.mark.parametrize("scheduler", ["fcfs", "static", "priority", "slo_aware"])
@pytest.mark.parametrize("variant", ["whole", "prefix", "preempt_recompute", "preempt_swap"])
def test_greedy_with_drafts_equals_hf_every_stack(heldout, drafter, scheduler, variant):
    prompts, max_tokens, expected = heldout
    overrides = {
        "whole": ["chunked_prefill=false", "max_num_batched_tokens=512", "max_model_len=512"],
        "prefix": ["allocator.prefix_caching=true", "max_num_batched_tokens=32"],
        "preempt_recompute": ["block_size=8", "num_kv_blocks=40"],
        "preempt_swap": ["block_size=8", "num_kv_blocks=40", "preemption=swap", "backend.num_swap_blocks=256"],
    }[variant]
    result = _serve(prompts, max_tokens, drafter, f"scheduler={scheduler}", "slo.ttft_ms=500", "slo.tpot_ms=100",
                    *overrides)
    assert [r["output_token_ids"] for r in result.requests] == expected
    assert result.summary["leaked_blocks"] == 0


@pytest.mark.slow  # twins: drafts at TP 1 here, TP 2's tokens in test_tp.py and test_quantization.py
def test_greedy_with_drafts_equals_hf_at_tp2(heldout):
    prompts, max_tokens, expected = heldout
    for drafter in ("drafter=draft_model", "drafter=ngram"):
        result = _serve(prompts[:6], max_tokens[:6], drafter, "tensor_parallel_size=2", "block_size=8",
                        "num_kv_blocks=40")
        assert [r["output_token_ids"] for r in result.requests] == expected[:6], drafter
        assert result.summary["num_accepted_tokens"] > 0


def test_seeded_sampling_with_drafts_is_reproducible(heldout):
    prompts, max_tokens, _ = heldout
    sampling = dict(temperature=1.0, seed=11)

    def outputs(*overrides):
        result = _serve(prompts[:6], max_tokens[:6], *overrides, **sampling)
        return [r["output_token_ids"] for r in result.requests], result.summary

    for drafter in ("drafter=draft_model", "drafter=ngram"):
        first, summary = outputs(drafter)
        assert summary["num_accepted_tokens"] > 0
        assert outputs(drafter)[0] == first
        assert outputs(drafter, "max_num_seqs=1")[0] == first  # batching does not matter either


# ---- bad input ---------------------------------------------------------------------------------

@pytest.mark.parametrize("k", [0, 17])
def test_k_out_of_range_names_the_key(k):
    with pytest.raises(ConfigError, match=f"drafter.k={k} must be between 1 and 16"):
        build_stack(compose("model=tiny_code", "drafter=ngram", f"drafter.k={k}"))


def test_a_draft_model_with_another_vocabulary_is_refused():
    from servelab.assemble.executor import model_path

    other = model_path(compose())  # the random tiny model: another vocabulary
    with pytest.raises(ConfigError, match=r"vocabulary of \d+ tokens but the target model has 259"):
        build_stack(compose("model=tiny_code", "drafter=draft_model", f"drafter.path={other}"))


def test_draft_model_without_a_path_for_an_arbitrary_target_is_refused():
    with pytest.raises(ConfigError, match="drafter=draft_model needs drafter.path"):
        build_stack(compose("drafter=draft_model"))


def test_the_simulator_refuses_drafts():
    with pytest.raises(ConfigError, match="backend=sim computes no tokens"):
        build_stack(compose("backend=sim", "model=llama3_8b", "hardware=h100", "drafter=ngram"))



def test_the_ngram_drafter_keeps_its_tables_in_step_with_the_sequences():
    """Incremental rows and keys (one token, several, rows reused after forget) give the same
    proposals as a search from scratch."""
    from servelab.plugins.drafters.ngram import NgramConfig, NgramDrafter
    from servelab.core.request import Sequence

    rng = random.Random(5)
    for min_n, max_n in ((1, 3), (2, 4), (3, 5), (4, 4)):
        drafter = NgramDrafter(NgramConfig(k=3, min_n=min_n, max_n=max_n), DrafterContext(None))
        seqs = [Sequence(Request(f"s{i}", tuple(rng.randrange(4) for _ in range(rng.randint(1, 30))), 99))
                for i in range(5)]
        for step in range(40):
            for seq in seqs:
                for _ in range(rng.choice([1, 1, 1, 3])):
                    seq.append_token(rng.randrange(4), 0.0)
            if step % 10 == 9:  # one ends, a new one takes its row
                drafter.forget(seqs[0])
                seqs[0] = Sequence(Request(f"n{step}", tuple(rng.randrange(4) for _ in range(7)), 99))
            got = drafter.propose(seqs, 3)
            assert got == [_lookup_reference(list(s.token_ids), min_n, max_n, 3) for s in seqs]


def test_the_ngram_index_stays_exact_through_rebuilds_and_row_reuse(monkeypatch):
    """A tiny starting table forces many rebuilds and long probe runs; rows are reset and reused."""
    from servelab.plugins.drafters import ngram_index
    from servelab.plugins.drafters.ngram import NgramConfig, NgramDrafter
    from servelab.core.request import Sequence

    monkeypatch.setattr(ngram_index, "_MIN_CAPACITY", 16)
    rng = random.Random(11)
    drafter = NgramDrafter(NgramConfig(k=4, min_n=1, max_n=4), DrafterContext(None))
    seqs = [Sequence(Request(f"s{i}", tuple(rng.randrange(6) for _ in range(rng.randint(1, 60))), 999))
            for i in range(9)]
    for step in range(60):
        for seq in seqs:
            for _ in range(rng.choice([1, 1, 2, 7])):
                seq.append_token(rng.randrange(6), 0.0)
        if step % 7 == 6:
            i = rng.randrange(len(seqs))
            drafter.forget(seqs[i])
            seqs[i] = Sequence(Request(f"n{step}", tuple(rng.randrange(6) for _ in range(rng.randint(1, 40))), 999))
        chosen = rng.sample(seqs, rng.randint(1, len(seqs)))  # not every sequence drafts every step
        assert drafter.propose(chosen, 4) == [_lookup_reference(list(s.token_ids), 1, 4, 4) for s in chosen]


def test_an_ngram_hash_collision_hides_an_occurrence_but_never_invents_one(monkeypatch):
    """With a hash that maps every n-gram to one of 1024 keys, n-grams overwrite each other's
    entries: proposals may be missing, but each one still follows a real earlier occurrence of a
    suffix of at least min_n tokens."""
    from servelab.plugins.drafters import ngram_index
    from servelab.plugins.drafters.ngram import prompt_lookup

    hashes = ngram_index.NgramIndex._hashes
    few_keys = np.uint64(0x3FF << ngram_index._END_BITS) | ngram_index._END_LIMIT  # 10 of the 40 key bits
    monkeypatch.setattr(ngram_index.NgramIndex, "_hashes", lambda self, *a: hashes(self, *a) & few_keys)
    rng = random.Random(3)
    seqs = [[rng.randrange(4) for _ in range(rng.randint(1, 50))] for _ in range(20)]
    lens = np.array([len(s) for s in seqs])
    table = np.full((len(seqs), lens.max()), -1, dtype=np.int64)
    for i, s in enumerate(seqs):
        table[i, :len(s)] = s
    got = prompt_lookup(table, lens, 2, 4, 3)
    assert any(g for g in got) and any(not g and _lookup_reference(s, 2, 4, 3) for g, s in zip(got, seqs))
    for tokens, drafts in zip(seqs, got):
        if drafts:
            assert any(tokens[end - 1:end + 1] == tokens[-2:] and tokens[end + 1:end + 1 + 3] == drafts
                       for end in range(1, len(tokens) - 1))


def test_a_profile_prices_drafts_as_computed_tokens():
    """The virtual clock charges a verify's drafts like prompt tokens (roofline counts every
    computed token already): speculation is not free on the modelled clock."""
    from servelab.sim.step_profile import feature_vector
    from servelab.core.step_work import StepWork

    verify = StepWork(num_tokens=5, num_seqs=1, decode_seqs=1, num_sampled=5, attended=500, context_tokens=104,
                      draft_tokens=4)
    plain = StepWork(num_tokens=1, num_seqs=1, decode_seqs=1, num_sampled=1, attended=500, context_tokens=104)
    assert feature_vector(verify, (128,), (4,))[1] == 4 and feature_vector(plain, (128,), (4,))[1] == 0
