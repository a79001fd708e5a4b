"""Shared fixtures: small HF-format checkpoints, composed configs, model-free stacks."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_SILENT", "true")
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).parent))

# Small shapes, one per property the model code must get right.
CHECKPOINTS = {
    "llama_gqa_untied": ("LlamaForCausalLM", dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                                  num_attention_heads=4, num_key_value_heads=2, vocab_size=384,
                                                  max_position_embeddings=512, tie_word_embeddings=False)),
    "llama_mha_tied": ("LlamaForCausalLM", dict(hidden_size=48, intermediate_size=96, num_hidden_layers=2,
                                                num_attention_heads=3, num_key_value_heads=3, vocab_size=300,
                                                max_position_embeddings=512, tie_word_embeddings=True)),
    "qwen2_bias_tied": ("Qwen2ForCausalLM", dict(hidden_size=64, intermediate_size=160, num_hidden_layers=2,
                                                 num_attention_heads=8, num_key_value_heads=2, vocab_size=320,
                                                 max_position_embeddings=512, tie_word_embeddings=True)),
    "qwen2_mqa_untied": ("Qwen2ForCausalLM", dict(hidden_size=96, intermediate_size=128, num_hidden_layers=3,
                                                  num_attention_heads=6, num_key_value_heads=1, vocab_size=256,
                                                  max_position_embeddings=512, tie_word_embeddings=False)),
}


@pytest.fixture(autouse=True)
def _logging_enabled_after():
    """A study run in-process (its rows call ``logging.disable``, as its worker processes do) must
    not hide the warnings later tests on the same worker assert."""
    yield
    logging.disable(logging.NOTSET)


@pytest.fixture(scope="session")
def checkpoint_dir(tmp_path_factory):
    """``checkpoint_dir(name)`` -> a written HF checkpoint from CHECKPOINTS (once per session)."""
    from servelab.exec.model.random_checkpoint import cached_random_checkpoint

    root = tmp_path_factory.mktemp("checkpoints")

    def get(name: str, **overrides) -> Path:
        arch, shape = CHECKPOINTS[name]
        return cached_random_checkpoint(arch, 1, {**shape, **overrides}, root)

    return get


# The stack tests were written against the random-weight model and the synthetic workload (any
# shape, any token id); the default config runs the trained model on corpus prompts instead.
TEST_DEFAULTS = ("model=tiny", "workload=synthetic")


def pin_test_defaults(overrides) -> list[str]:
    """``overrides`` plus ``model=tiny`` / ``workload=synthetic`` where that group is not chosen."""
    overrides = list(overrides)
    chosen = {o.split("=", 1)[0].lstrip("+~") for o in overrides if "=" in o}
    return overrides + [d for d in TEST_DEFAULTS if d.split("=")[0] not in chosen]  # after any --flags


def compose(*overrides: str, **values):
    from servelab.api import compose as api_compose

    values.setdefault("logger", "none")
    values.setdefault("progress", False)
    return api_compose(pin_test_defaults(overrides), **values)


@pytest.fixture
def fake_stack():
    """``fake_stack(*overrides, num_kv_blocks=N)`` -> (stack, clock) with a FakeExecutor (no model)."""
    from servelab.assemble.stack import build_stack
    from servelab.kit.testing import FakeExecutor, VirtualClock

    def make(*overrides: str, num_kv_blocks: int = 256, **values):
        clock = VirtualClock()
        cfg = compose(*overrides, **values)
        executor = FakeExecutor(clock, num_kv_blocks=num_kv_blocks)
        return build_stack(cfg, executor=executor, clock=clock), clock

    return make


def serve_tiny_code(prompts, max_tokens, *overrides, **sampling):
    """Run ``prompts`` through the shipped trained model (8 sequences, 128-token steps, one thread)
    with ``overrides`` and return the :class:`~servelab.api.LLM`'s results."""
    from servelab.api import LLM

    lab = LLM(compose("model=tiny_code", "max_num_seqs=8", "max_num_batched_tokens=128", "backend.num_threads=1",
                      *overrides))
    for p, m in zip(prompts, max_tokens):
        lab.add_request(p, m, ignore_eos=False, **sampling)
    while lab.has_unfinished():
        lab.step()
    result = lab.results()
    lab.close()
    return result
