"""Hydra composition: defaults, typed groups, and the errors users see for bad values."""

from __future__ import annotations

import re

import pytest

from conftest import compose
from servelab.assemble.validate import validate
from servelab.core.errors import ConfigError


def test_default_stack_composes():
    cfg = compose()
    assert (cfg.scheduler.name, cfg.allocator.name, cfg.preemption.name, cfg.drafter.name) == \
        ("fcfs", "paged", "recompute", "none")
    assert cfg.model.name == "tiny" and cfg.workload.name == "synthetic" and cfg.backend.name == "torch"
    for key in ("block_size", "seed", "max_num_seqs", "max_num_batched_tokens", "num_kv_blocks", "max_model_len"):
        assert key in cfg
    assert cfg.workload.seed == cfg.seed  # flows down by interpolation


def test_readme_override_line_composes():
    cfg = compose("scheduler=fcfs", "allocator=paged", "block_size=16", "allocator.prefix_caching=true")
    assert cfg.block_size == 16 and cfg.allocator.prefix_caching is True


@pytest.mark.parametrize("override", ["bogus=1", "scheduler.bogus=1", "workload.nope=2"])
def test_unknown_keys_fail_at_compose_time(override):
    with pytest.raises(ConfigError, match=rf"^unknown key '{override.split('=')[0]}'"):
        compose(override)


@pytest.mark.parametrize("override", ["allocator.prefix_caching=maybe", "model.dtype=float64",
                                      "attention_backend=cuda", "max_num_seqs=1.5"])
def test_wrong_types_fail_at_compose_time(override):
    with pytest.raises(ConfigError, match=rf"^{re.escape(override)}: "):
        compose(override)


def test_unknown_plugin_lists_available_options():
    with pytest.raises(ConfigError, match=r"^unknown scheduler option 'nope'; options: fcfs, "):
        compose("scheduler=nope")


@pytest.mark.parametrize("override,key", [
    ("block_size=12", "block_size"), ("block_size=512", "block_size"), ("block_size=abc", "block_size"), ("max_num_seqs=0", "max_num_seqs"),
    ("max_num_batched_tokens=8", "max_num_batched_tokens"), ("num_kv_blocks=0", "num_kv_blocks"),
    ("slo.ttft_ms=0", "slo.ttft_ms"), ("slo.tpot_ms=-5", "slo.tpot_ms"),
    ("tensor_parallel_size=0", "tensor_parallel_size"),
])
def test_bad_values_name_the_key(override, key):
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        validate(compose(override))


def test_chunked_prefill_off_needs_budget_for_a_whole_prompt():
    with pytest.raises(ConfigError, match="chunked_prefill=false needs max_num_batched_tokens"):
        validate(compose("chunked_prefill=false", "max_num_batched_tokens=512", "max_model_len=1024"))
