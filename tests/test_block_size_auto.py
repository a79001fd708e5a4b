"""``block_size=auto``: the chooser on synthetic length profiles, the config path, and bad input."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from conftest import compose
from servelab.core.errors import ConfigError
from servelab.core.request import Request
from servelab.assemble import block_size as auto_bs
from servelab.run import session
from servelab.assemble.block_size import SIZE_RANGE, LengthProfile, choose_block_size, shared_prefixes, waste
from servelab.run.session import run_job
from servelab.assemble.stack import build_stack
from servelab.assemble.validate import validate


def _profile(prompt, output, shared=None) -> LengthProfile:
    return LengthProfile(np.asarray(prompt), np.asarray(output), None if shared is None else np.asarray(shared))


def test_waste_is_exact_over_every_step():
    rng = np.random.default_rng(0)
    prompt, output = rng.integers(1, 300, 40), rng.integers(1, 50, 40)
    for bs in (8, 32):
        lengths = [L for p, o in zip(prompt, output) for L in range(p, p + o)]
        allocated = sum(-(-L // bs) * bs for L in lengths)
        assert waste(_profile(prompt, output), bs) == pytest.approx(1 - sum(lengths) / allocated)


def test_lengths_in_multiples_of_64_choose_a_large_block():
    rng = np.random.default_rng(1)
    choice = choose_block_size(_profile(rng.integers(1, 40, 500) * 64, np.ones(500, int)), SIZE_RANGE)
    assert choice.chosen == 64  # no waste up to 64, the least overhead; 128 wastes half a block on odd multiples
    assert "KV waste 0.0% (32: 0.0%, 128: " in choice.reason


def test_short_uniform_lengths_choose_a_small_block():
    rng = np.random.default_rng(2)
    choice = choose_block_size(_profile(rng.integers(1, 20, 500), rng.integers(1, 5, 500)), SIZE_RANGE, "here")
    assert choice.chosen == 8
    assert choice.reason.startswith("block_size=auto -> 8 of 8/16/32/64/128 (here; mean prompt 10, output 3 tokens)")
    assert re.search(r"KV waste \d+\.\d% \(16: \d+\.\d%\), block overhead 1\.6% \(16: 0\.8%\)", choice.reason)
    assert choice.scores[8] < choice.scores[16] < choice.scores[128]


def test_long_lengths_move_the_choice_up():
    rng = np.random.default_rng(3)
    medium = choose_block_size(_profile(rng.integers(500, 1500, 500), rng.integers(50, 300, 500)), SIZE_RANGE)
    long = choose_block_size(_profile(rng.integers(6000, 10000, 500), rng.integers(1, 30, 500)), SIZE_RANGE)
    assert medium.chosen == 16 and long.chosen >= 32


def test_prefix_sharing_favours_the_sharing_granularity():
    rng = np.random.default_rng(4)
    prompt, output = rng.integers(3000, 4000, 300), np.full(300, 50)
    shared = (2 * rng.integers(0, 50, 300) + 1) * 16  # prefixes shared in an odd number of 16-token blocks
    plain = choose_block_size(_profile(prompt, output), SIZE_RANGE)
    sharing = choose_block_size(_profile(prompt, output, shared), SIZE_RANGE)
    assert plain.chosen == 32 and sharing.chosen == 16
    assert "prefix loss 0.0 (8: 0.0, 32: " in sharing.reason and "tokens per request with a shared prefix (300)" \
        in sharing.reason


def test_shared_prefixes_are_longest_common_prefixes_with_earlier_requests():
    base = tuple(range(100))
    requests = [Request("a", base + (1, 2), 1), Request("b", base[:37] + (999,) * 20, 1),
                Request("c", base[:90], 1), Request("d", (5,) * 30, 1), Request("e", base, 1, cache_salt="x"),
                Request("f", base[:37] + (999,) * 5 + (7,), 1)]
    # c: all of it but the last token (computed for the first output); e: another salt shares nothing
    assert shared_prefixes(requests, 8).tolist() == [0, 37, 89, 0, 0, 42]


def test_explicit_sizes_are_unchanged(fake_stack):
    stack, _ = fake_stack("block_size=32")
    assert stack.limits.block_size == 32 and stack.block_size_auto is None
    for bs in (1, 256):
        validate(compose(f"block_size={bs}", "max_num_batched_tokens=2048"))


@pytest.mark.parametrize("value", ["banana", "12", "512", "16.0"])
def test_a_bad_block_size_is_one_line_naming_the_key_and_the_values(value):
    with pytest.raises(ConfigError) as err:
        validate(compose(f"block_size={value}"))
    message = str(err.value)
    assert "\n" not in message and message.startswith("block_size=")
    assert "power of two between 1 and 256, or auto" in message


def test_auto_with_a_backend_that_supports_no_size_is_one_line(monkeypatch):
    monkeypatch.setattr(auto_bs, "supported_sizes", lambda cfg, head_dim: ("attention_backend=fake", (512,)))
    with pytest.raises(ConfigError, match=r"^block_size=auto: attention_backend=fake supports no block size "
                                          r"in 8\.\.128") as err:
        build_stack(compose("block_size=auto"))
    assert "\n" not in str(err.value)


def test_auto_with_triton_and_an_unsupported_head_dim_names_both():
    pytest.importorskip("triton")
    cfg = compose("block_size=auto", "attention_backend=triton", "model.hidden_size=16", "model.num_attention_heads=4",
                  "model.num_key_value_heads=4")  # head_dim 4 < the kernels' 8
    with pytest.raises(ConfigError, match=r"block_size=auto: attention_backend=triton \(head_dim=4\) supports no "):
        build_stack(cfg)


def test_auto_resolves_to_an_int_and_the_run_records_why(tmp_path):
    cfg = compose("block_size=auto", "workload.num_requests=6", "workload.prompt_len.max=40",
                  "workload.output_len.max=8", "model.num_hidden_layers=1", "backend.num_threads=1")
    result = run_job(cfg, tmp_path)
    assert cfg.block_size == 8 and result.summary["block_size"] == 8
    auto = json.loads((tmp_path / "summary.json").read_text())["block_size_auto"]
    assert auto["chosen"] == 8
    assert auto["reason"].startswith("block_size=auto -> 8 of 8/16/32/64/128 (attention_backend=torch, 6 requests "
                                     "of workload=synthetic")
    assert "block_size: 8" in (tmp_path / "config.yaml").read_text().splitlines()
    assert result.summary["num_finished"] == 6


def test_auto_in_the_simulator_reads_the_requests_once(tmp_path, monkeypatch):
    built = []
    real = auto_bs.build_requests
    for module in (auto_bs, session):
        monkeypatch.setattr(module, "build_requests", lambda *a: built.append(1) or real(*a))
    cfg = compose("backend=sim", "model=llama3_8b", "block_size=auto", "workload.num_requests=20",
                  "allocator.prefix_caching=true")
    result = run_job(cfg, tmp_path)
    assert built == [1] and isinstance(cfg.block_size, int)
    assert result.summary["block_size_auto"]["chosen"] == result.summary["block_size"] == cfg.block_size
    assert "backend=sim (vLLM's CUDA sizes)" in result.summary["block_size_auto"]["reason"]
    assert "prefix loss" in result.summary["block_size_auto"]["reason"]


def test_explicit_size_runs_record_no_auto_key(tmp_path):
    cfg = compose("backend=sim", "model=llama3_8b", "block_size=32", "workload.num_requests=4")
    assert "block_size_auto" not in run_job(cfg, tmp_path).summary
