"""The real mixture-of-experts model on CPU (issue 46, part 3): tiny random Qwen3-MoE and Mixtral
checkpoints written by transformers run on servelab's own model with greedy tokens equal to
transformers' generate; expert parallelism (2 gloo ranks, experts split) and pipeline parallelism
(2 stages, layers split) give the tokens of one process; the policies run on it unchanged."""

from __future__ import annotations

import json

import pytest
import yaml

from conftest import compose
from hf_reference import random_checkpoints_with_greedy
from servelab.api import LLM
from servelab.exec.model.random_checkpoint import moe_config_kwargs
from servelab.run.session import run_job

BASE = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
            vocab_size=256, max_position_embeddings=256, initializer_range=0.1)
ARCHS = {  # every second layer MoE (Qwen3-MoE's decoder_sparse_step), top-k renormalised or not; Mixtral: all MoE
    "qwen3_moe": ("Qwen3MoeForCausalLM", dict(head_dim=24, **moe_config_kwargs("Qwen3MoeForCausalLM", 4, 2, 32, 2))),
    "qwen3_moe_raw_topk": ("Qwen3MoeForCausalLM", moe_config_kwargs("Qwen3MoeForCausalLM", 8, 3, 16, 1, False)),
    "mixtral": ("MixtralForCausalLM", moe_config_kwargs("MixtralForCausalLM", 4, 2, 48)),
}
# a small synthetic batch through the engine: chunked prompts, decodes and preemption-free
RUN = ("workload=synthetic", "block_size=8", "max_num_seqs=4", "max_num_batched_tokens=32", "max_model_len=128",
       "workload.num_requests=6", "workload.arrival=all_at_once", "workload.prompt_len.min=8",
       "workload.prompt_len.max=40", "workload.output_len.min=8", "workload.output_len.max=16", "backend.num_threads=1")


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    return random_checkpoints_with_greedy(tmp_path_factory.mktemp("moe"), ARCHS, BASE, 5)


@pytest.mark.parametrize("name", list(ARCHS))
def test_moe_checkpoint_tokens_equal_transformers(checkpoints, name):
    models, prompts, max_tokens = checkpoints
    path, expected = models[name]
    lab = LLM(compose("model=hf", f"model.path={path}", "max_model_len=256", "max_num_batched_tokens=64",
                      "max_num_seqs=4"))
    for p, n in zip(prompts, max_tokens):
        lab.add_request(p, n)
    while lab.has_unfinished():
        lab.step()
    assert [r["output_token_ids"] for r in lab.results().requests] == expected


def test_a_moe_checkpoint_run_records_its_experts(checkpoints, tmp_path):
    """config.yaml says what ran: the checkpoint's MoE fields, under the model.* names."""
    path = checkpoints[0]["mixtral"][0]
    run_job(compose("model=hf", f"model.path={path}", *RUN, "workload.num_requests=1"), tmp_path)
    recorded = yaml.safe_load((tmp_path / "config.yaml").read_text())["model"]
    assert (recorded["num_experts"], recorded["num_experts_per_tok"], recorded["moe_intermediate_size"]) == (4, 2, 48)


def tokens(result) -> dict[str, list[int]]:
    return {r["id"]: r["output_token_ids"] for r in result.requests}


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    return run_job(compose("model=tiny_moe", *RUN), tmp_path_factory.mktemp("one"))


@pytest.mark.parametrize("layout", [
    ("tensor_parallel_size=2", "expert_parallel_size=2"),  # 4 experts a rank, each whole
    ("pipeline_parallel_size=2",),  # layers 0-1 | 2-3: a dense and a MoE layer each
])
def test_expert_and_pipeline_parallel_tokens_equal_one_process(one_process, tmp_path, layout):
    result = run_job(compose("model=tiny_moe", *RUN, *layout), tmp_path)
    assert tokens(result) == tokens(one_process)
    assert len({t for ts in tokens(result).values() for t in ts}) > 10  # not a degenerate model
    assert result.summary["leaked_blocks"] == 0 and result.summary["comm_time_s"] > 0


@pytest.mark.slow
@pytest.mark.parametrize("model, layout", [
    ("tiny_moe", ("tensor_parallel_size=2",)),  # every expert split over both ranks (TP within experts)
    ("tiny_moe", ("tensor_parallel_size=2", "expert_parallel_size=2", "pipeline_parallel_size=2")),  # 4 ranks
    ("tiny_moe", ("tensor_parallel_size=2", "model.quantization=int8")),  # an expert's INT8 rows span its ranks
    ("tiny_moe", ("tensor_parallel_size=2", "expert_parallel_size=2", "model.quantization=int8")),
    ("tiny", ("pipeline_parallel_size=2", "num_kv_blocks=12", "preemption=swap", "backend.num_swap_blocks=64")),
    ("tiny", ("pipeline_parallel_size=3", "model.tie_word_embeddings=true")),  # a tied LM head on the last stage
])
def test_more_layouts_equal_one_process(tmp_path, model, layout):
    plain = tuple(o for o in layout if not o.endswith("_parallel_size=2") and not o.endswith("_size=3"))
    reference = run_job(compose(f"model={model}", *RUN, *plain), tmp_path / "one")
    result = run_job(compose(f"model={model}", *RUN, *layout), tmp_path / "many")
    assert tokens(result) == tokens(reference)
    assert result.summary["leaked_blocks"] == 0
    assert result.summary["num_preemptions"] == reference.summary["num_preemptions"]
    if "preemption=swap" in layout:
        assert result.summary["num_preemptions_by_kind"].get("swap", 0) > 0


# chats that repeat their conversation, on a pool too small to keep them: prefix hits, tiers, preemption
CHATS = ("model=tiny_moe", "clock=virtual", "time_model=roofline", "hardware=h100", "num_kv_blocks=24",
         "block_size=8", "workload=chat_sessions", "workload.num_sessions=5", "workload.session_rate=4.0",
         "workload.think_time_s=2.0", "workload.num_system_prompts=2", "workload.system_prompt_len.min=16",
         "workload.system_prompt_len.max=48", "workload.user_len.max=24", "workload.output_len.max=10",
         "workload.turns.min=2", "workload.turns.max=3", "max_model_len=256", "backend.num_threads=1")


def _chat_tokens(path, *overrides):
    run_job(compose(*CHATS, *overrides), path)
    lines = [json.loads(line) for line in (path / "requests.jsonl").read_text().splitlines()]
    return {r["id"]: r["output_token_ids"] for r in lines}, json.loads((path / "summary.json").read_text())


def test_policies_run_unchanged_on_the_moe_model(tmp_path):
    """A non-default scheduler with the paged allocator's prefix cache, and a host KV tier below it:
    the tokens of plain FCFS without a cache."""
    plain, _ = _chat_tokens(tmp_path / "plain")
    cached, summary = _chat_tokens(tmp_path / "lpm", "scheduler=lpm", "allocator=paged",
                                   "allocator.prefix_caching=true")
    assert summary["prefix_cache_hit_rate"] > 0
    assert cached == plain
    tiered, summary = _chat_tokens(tmp_path / "tier", "allocator.prefix_caching=true", "kv_tiers=host",
                                   "kv_tier_policy=write_back")
    assert summary["kv_tier_host_hit_rate"] > 0
    assert tiered == plain


@pytest.mark.slow
def test_a_cluster_of_moe_replicas_runs(tmp_path):
    result = run_job(compose("model=tiny_moe", *RUN, "cluster.replicas=2", "router=round_robin"), tmp_path)
    assert result.summary["num_finished"] == 6 and result.summary["leaked_blocks"] == 0
