"""Tensor parallelism on CPU (gloo, 2 processes): same greedy tokens as TP=1, faults named and bounded.

Each TP test spawns one worker process (~10 s on 2 busy cores), so the expensive cases share
executors where they can.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import time

import pytest
import torch

from servelab.core.contexts import ExecutorContext
from servelab.core.executor import BackendConfig
from servelab.api import compose
from servelab.core.batch import StepBatch
from servelab.exec.executor import LocalExecutor
from servelab.exec.model.random_checkpoint import write_random_checkpoint
from servelab.run.session import run_job
from servelab.assemble.executor import worker_config
from servelab.assemble.stack import build_stack
from servelab.core.errors import ConfigError
from servelab.exec.tp import TPExecutor, TPWorkerError

SHAPE = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
             max_position_embeddings=256, initializer_range=0.3)  # large weights: context matters
MODELS = {  # name: (architecture, extra config): KV heads split, replicated, Qwen2 with qkv bias
    "llama-kv-split": ("LlamaForCausalLM", dict(num_key_value_heads=2, vocab_size=1001)),
    "llama-kv-replicated-tied": ("LlamaForCausalLM", dict(num_key_value_heads=1, vocab_size=999,
                                                          tie_word_embeddings=True)),
    "qwen2-bias": ("Qwen2ForCausalLM", dict(num_key_value_heads=2, vocab_size=1000)),
}


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("tp_models")
    return {name: str(write_random_checkpoint(root / name, arch, seed=3, **SHAPE, **extra))
            for name, (arch, extra) in MODELS.items()}


def tp_config(model_path: str, tp: int, *extra: str):
    return compose(["model=hf", "workload=synthetic", f"model.path={model_path}", f"tensor_parallel_size={tp}", "logger=none", "progress=false",
                    "block_size=8", "max_num_seqs=4", "max_num_batched_tokens=32", "max_model_len=128",
                    "workload.num_requests=6", "workload.arrival=all_at_once",
                    "workload.prompt_len.min=8", "workload.prompt_len.max=40",
                    "workload.output_len.min=8", "workload.output_len.max=16", "debug.log_steps=true", *extra])


def tokens(result) -> dict[str, list[int]]:
    return {r["id"]: r["output_token_ids"] for r in result.requests}


@pytest.mark.parametrize("name, extra", [
    ("llama-kv-split", ()),
    ("llama-kv-replicated-tied", ("num_kv_blocks=10",)),  # 6 requests of up to 7 blocks: preemption
    ("qwen2-bias", ()),
    ("llama-kv-split", ("num_kv_blocks=10", "preemption=swap", "backend.num_swap_blocks=64")),
])
def test_tp2_greedy_tokens_match_tp1(checkpoints, tmp_path, name, extra):
    reference = run_job(tp_config(checkpoints[name], 1, *extra), tmp_path / "tp1")
    result = run_job(tp_config(checkpoints[name], 2, *extra), tmp_path / "tp2")

    assert tokens(result) == tokens(reference)
    assert all(len(t) >= 8 for t in tokens(result).values())
    assert len({t for ts in tokens(result).values() for t in ts}) > 10  # not a degenerate model
    assert result.summary["leaked_blocks"] == 0
    assert result.summary["tensor_parallel_size"] == 2
    assert result.summary["num_preemptions"] == reference.summary["num_preemptions"]
    if extra:
        kind = "swap" if "preemption=swap" in extra else "recompute"
        assert result.summary["num_preemptions_by_kind"].get(kind, 0) > 0
    steps = [json.loads(line) for line in (tmp_path / "tp2" / "steps.jsonl").read_text().splitlines()]
    assert all(s["comm_s"] > 0 and s["model_s"] > 0 for s in steps)
    assert result.summary["comm_time_s"] > 0 and reference.summary["comm_time_s"] == 0
    assert not multiprocessing.active_children(), "run_job must shut down the workers it started"


def _prefill_then_move(swap: bool, block_size: int = 8) -> list[StepBatch]:
    """Prefill 20 tokens into blocks 0-2; then decode from copies of them (block copy, or swap out + in)."""
    prompt = list(range(5, 25))
    n = len(prompt)

    def batch(ids, first_pos, table, **ops):
        pos = torch.arange(first_pos, first_pos + len(ids))
        slots = torch.tensor([table[p // block_size] * block_size + p % block_size for p in pos.tolist()])
        ctx = first_pos + len(ids)
        return StepBatch(torch.tensor(ids), pos, slots, torch.tensor([table], dtype=torch.int32),
                         torch.tensor([0, len(ids)], dtype=torch.int32), torch.tensor([ctx], dtype=torch.int32),
                         len(ids), ctx, torch.tensor([len(ids) - 1]), [None], [0], **ops)

    steps = [batch(prompt, 0, [0, 1, 2])]
    if swap:
        steps.append(batch([7], n, [0, 1, 2], swap_out=[(0, 0), (1, 1), (2, 2)]))
        steps.append(batch([8], n + 1, [5, 6, 7], swap_in=[(0, 5), (1, 6), (2, 7)]))
    else:
        steps.append(batch([7], n, [3, 4, 5], copy_blocks=[(0, 3), (1, 4), (2, 5)]))
    return steps


def test_block_copies_and_swaps_run_on_every_rank(checkpoints):
    """Decoding from copied / swapped-back blocks needs every rank's shard of those blocks moved."""
    cfg = tp_config(checkpoints["llama-kv-split"], 2, "num_kv_blocks=8", "backend.num_swap_blocks=4")
    wcfg = worker_config(cfg)
    local = LocalExecutor(BackendConfig(), ExecutorContext("llama", worker=wcfg))
    expected = [local.execute(b).sampled for b in _prefill_then_move(False) + _prefill_then_move(True)]
    tp = TPExecutor(BackendConfig(num_threads=1), ExecutorContext("llama", tensor_parallel_size=2, worker=wcfg))
    try:
        assert tp.num_kv_blocks == 8
        got = [tp.execute(b).sampled for b in _prefill_then_move(False) + _prefill_then_move(True)]
    finally:
        tp.shutdown()
    assert got == expected
    assert not multiprocessing.active_children()


@pytest.mark.parametrize("sig, expect, bound_s", [
    # Bounds: "within seconds" with room for a loaded CI box (detection takes ~0.05 s / the 2 s timeout).
    (signal.SIGKILL, "rank 1 .* was killed by SIGKILL at step 3", 15.0),
    (signal.SIGSTOP, "rank 1 did not finish step 3 within 2 s", 2.0 + 15.0),
], ids=["killed", "hung"])
def test_a_dead_or_hung_worker_stops_the_run_naming_its_rank(checkpoints, tmp_path, sig, expect, bound_s):
    cfg = tp_config(checkpoints["llama-kv-split"], 2, "backend.tp_step_timeout_s=2")
    stack = build_stack(cfg)
    pid = stack.executor.worker_pids[0]
    hit = {}

    def kill_after_step_2(record):
        if record.step == 2:
            os.kill(pid, sig)
            hit["t"] = time.monotonic()

    stack.engine.step_listeners.append(kill_after_step_2)
    try:
        with pytest.raises(TPWorkerError, match=expect):
            run_job(cfg, tmp_path, stack=stack)
        assert time.monotonic() - hit["t"] < bound_s
    finally:
        stack.executor.shutdown()
    assert not multiprocessing.active_children()
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert summary["status"].startswith("failed: TPWorkerError") and "rank 1" in summary["status"]
    assert summary["num_requests"] == 6 and summary["output_tokens"] > 0
    assert len((tmp_path / "requests.jsonl").read_text().splitlines()) == 6


def test_tensor_parallel_size_below_one_is_a_config_error(checkpoints):
    with pytest.raises(ConfigError, match="tensor_parallel_size=0 must be >= 1"):
        build_stack(tp_config(checkpoints["llama-kv-split"], 0))


@pytest.mark.parametrize("tp, message", [
    (3, "tensor_parallel_size=3 does not divide num_attention_heads=4"),
    (8, "tensor_parallel_size=8 does not divide num_attention_heads=4"),
])
def test_heads_not_divisible_fail_before_spawning(checkpoints, tp, message):
    with pytest.raises(ConfigError, match=message):
        build_stack(tp_config(checkpoints["llama-kv-split"], tp))
    assert not multiprocessing.active_children()


def test_kv_heads_that_cannot_be_split_or_replicated_are_a_config_error(tmp_path):
    path = write_random_checkpoint(tmp_path / "m", "LlamaForCausalLM", **{**SHAPE, "num_attention_heads": 12,
                                                                          "hidden_size": 48},
                                   num_key_value_heads=3, vocab_size=64)
    with pytest.raises(ConfigError, match="tensor_parallel_size=2 does not divide num_key_value_heads=3"):
        build_stack(tp_config(str(path), 2))
    with pytest.raises(ConfigError, match="tensor_parallel_size=4 exceeds num_key_value_heads=3"):
        build_stack(tp_config(str(path), 4))


def test_more_ranks_than_cuda_devices_is_a_config_error(checkpoints, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(ConfigError, match="tensor_parallel_size=2 needs 2 CUDA devices .* but 1 are visible"):
        build_stack(tp_config(checkpoints["llama-kv-split"], 2, "backend.device=cuda"))
    assert not multiprocessing.active_children()
