"""Mixture-of-experts and MLA shapes (issue 46, part 1): the catalogue presets' parameters against the
published totals, KV bytes per token, weights per rank and the KV pool under TP, EP and PP, the
config.json fields of each family, and the layouts refused in one line naming the key."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import REPO, compose
from servelab.assemble.executor import executor_context, model_shape
from servelab.assemble.stack import build_stack
from servelab.core.errors import ConfigError
from servelab.core.parallel_layout import pipeline_stages
from servelab.core.shapes import HardwareProfile, ModelShape
from servelab.sim.executor import plan_memory

H100 = HardwareProfile("h100", memory_gb=80, hbm_bandwidth_gb_s=3350, peak_tflops=989, link_bandwidth_gb_s=450,
                       host_link_gb_s=64)

# preset: (total, active) parameters as the model cards state them (B), KV bytes per token in bf16 at TP 1
PUBLISHED = {
    "mixtral_8x7b": (46.7, 12.9, 2 * 32 * 8 * 128 * 2),
    "qwen3_30b_a3b": (30.5, 3.3, 2 * 48 * 4 * 128 * 2),
    "qwen3_235b_a22b": (235, 22, 2 * 94 * 4 * 128 * 2),
    "deepseek_v3": (671, 37, 61 * (512 + 64) * 2),  # MLA: the latent and the RoPE key, one per layer
}


def shape(name: str) -> ModelShape:
    return model_shape(compose(f"model={name}", "backend=sim"))


@pytest.mark.parametrize("name", list(PUBLISHED))
def test_presets_have_the_published_parameters_and_kv_bytes(name):
    total, active, kv = PUBLISHED[name]
    s = shape(name)
    assert s.num_params / 1e9 == pytest.approx(total, rel=0.01)
    assert s.active_params / 1e9 == pytest.approx(active, rel=0.03)
    assert s.kv_bytes_per_token(2) == kv


def test_mla_latent_is_on_every_tensor_parallel_rank_and_gqa_heads_split():
    dsv3, qwen = shape("deepseek_v3"), shape("qwen3_30b_a3b")
    assert dsv3.kv_bytes_per_token(2, tp=8) == dsv3.kv_bytes_per_token(2) == 70_272
    assert dsv3.kv_bytes_per_token(1, scale_bytes=4) == 61 * (576 + 4)  # fp8 cache: one scale per token and layer
    assert qwen.kv_bytes_per_token(2, tp=4) == qwen.kv_bytes_per_token(2) / 4
    assert qwen.kv_bytes_per_token(2, tp=8) == qwen.kv_bytes_per_token(2) / 4  # 4 KV heads: replicated past 4


def test_which_layers_are_moe():
    assert shape("deepseek_v3").num_moe_layers == 58  # first_k_dense_replace = 3
    assert shape("mixtral_8x7b").num_moe_layers == 32
    assert shape("tiny_moe").num_moe_layers == 2  # every second layer
    assert not shape("llama3_70b").is_moe and shape("llama3_70b").active_params == shape("llama3_70b").num_params


def test_config_json_fields_of_each_family(tmp_path):
    base = dict(hidden_size=64, intermediate_size=256, num_hidden_layers=4, num_attention_heads=4,
                num_key_value_heads=2, vocab_size=100)
    families = {
        "mixtral": (dict(num_local_experts=8, num_experts_per_tok=2),
                    dict(num_experts=8, experts_per_token=2, moe_intermediate_size=256)),
        "qwen3_moe": (dict(num_experts=16, num_experts_per_tok=4, moe_intermediate_size=32, decoder_sparse_step=2),
                      dict(num_experts=16, experts_per_token=4, moe_intermediate_size=32, moe_layer_step=2)),
        "qwen2_moe": (dict(num_experts=60, num_experts_per_tok=4, moe_intermediate_size=16,
                           shared_expert_intermediate_size=64),
                      dict(num_experts=60, num_shared_experts=1, shared_expert_intermediate_size=64)),
        "deepseek_v3": (dict(n_routed_experts=32, n_shared_experts=2, num_experts_per_tok=4, moe_intermediate_size=16,
                             first_k_dense_replace=1, moe_layer_freq=1, kv_lora_rank=32, q_lora_rank=48,
                             qk_rope_head_dim=8, qk_nope_head_dim=16, v_head_dim=16),
                        dict(num_experts=32, num_shared_experts=2, first_dense_layers=1, kv_lora_rank=32,
                             qk_rope_head_dim=8)),
    }
    for family, (fields, expected) in families.items():
        (tmp_path / "config.json").write_text(json.dumps({**base, **fields}))
        s = ModelShape.from_config_json(tmp_path)
        assert {k: getattr(s, k) for k in expected} == expected, family
    assert s.kv_bytes_per_token(2) == 4 * (32 + 8) * 2
    assert s.shared_intermediate_size == 2 * 16


def test_expert_parallelism_keeps_one_tp_share_of_the_weights_per_rank():
    """Experts split ep ways, each expert's MLP tp/ep ways: every rank holds 1/tp of the experts."""
    s = shape("qwen3_235b_a22b")
    assert s.weight_bytes_per_rank(2, 8) == pytest.approx(235.09e9 * 2 / 8, rel=1e-3)
    for ep in (1, 2, 8):
        memory = plan_memory(s, H100, 8, 2, 2, 16, 0.9, 2.0, ep=ep)
        assert memory.weight_bytes == s.weight_bytes_per_rank(2, 8)


def test_pipeline_stages_split_layers_as_vllm_and_hold_their_own_weights_and_kv():
    assert [len(r) for r in pipeline_stages(94, 4)] == [23, 24, 24, 23]  # the remainder before the last stage
    assert [len(r) for r in pipeline_stages(80, 2)] == [40, 40]
    llama = shape("llama3_70b")
    stages = [llama.weight_bytes_per_rank(2, 4, pp=2, stage=i) for i in range(2)]
    assert sum(stages) * 4 == pytest.approx(llama.weight_bytes(2))  # untied: nothing held twice
    assert llama.weight_bytes_per_rank(2, 4, pp=2) == max(stages)
    tp8 = plan_memory(llama, H100, 8, 2, 2, 16, 0.9, 2.0)
    tp4pp2 = plan_memory(llama, H100, 4, 2, 2, 16, 0.9, 2.0, pp=2)
    # the same eight GPUs: a stage holds half the layers on half the ranks, so the same KV bytes per block
    assert tp4pp2.bytes_per_block == tp8.bytes_per_block
    assert tp4pp2.weight_bytes == pytest.approx(tp8.weight_bytes, rel=0.01)
    assert abs(tp4pp2.num_blocks - tp8.num_blocks) / tp8.num_blocks < 0.01


def test_a_tied_lm_head_is_a_copy_of_its_own_on_the_last_stage():
    tied = ModelShape(4, 64, 128, 4, 2, 16, 1000, tie_word_embeddings=True)
    one = tied.weight_bytes(2)
    two = [tied.weight_bytes_per_rank(2, 1, pp=2, stage=i) for i in range(2)]
    assert sum(two) == one + 1000 * 64 * 2


def test_deepseek_v3_fits_eight_h200s_with_one_byte_linears_not_in_bf16():
    with pytest.raises(ConfigError, match="the weights do not fit: 167.8 GB per rank at tensor_parallel_size=8"):
        build_stack(compose("backend=sim", "model=deepseek_v3", "hardware=h200", "tensor_parallel_size=8"))
    stack = build_stack(compose("backend=sim", "model=deepseek_v3", "hardware=h200", "tensor_parallel_size=8",
                                "model.quantization=int8"))
    assert stack.executor.bytes_per_block == 70_272 * 16


@pytest.mark.parametrize("overrides, message", [
    (("model=tiny", "tensor_parallel_size=2", "expert_parallel_size=2"),
     "expert_parallel_size=2 needs a mixture-of-experts model, and this one is dense"),
    (("model=tiny_moe", "expert_parallel_size=2"), "expert_parallel_size=2 must divide tensor_parallel_size=1"),
    (("model=tiny_moe", "tensor_parallel_size=4", "expert_parallel_size=4", "model.num_attention_heads=8",
      "model.num_key_value_heads=4", "model.num_experts=6"), "expert_parallel_size=4 does not divide the model's 6"),
    (("model=tiny", "pipeline_parallel_size=5"), "pipeline_parallel_size=5 exceeds the model's 4 layers"),
    (("model=tiny", "pipeline_parallel_size=0"), "pipeline_parallel_size=0 must be >= 1"),
])
def test_bad_layouts_are_refused_naming_the_key(overrides, message):
    with pytest.raises(ConfigError, match=message):
        executor_context(compose(*overrides))


def test_a_bad_layout_is_one_line_and_exit_2_on_the_command_line():
    proc = subprocess.run([sys.executable, str(REPO / "run.py"), "model=tiny", "logger=none", "tensor_parallel_size=2",
                           "expert_parallel_size=2"], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "servelab: error: expert_parallel_size=2 needs a mixture-of-experts model, and this one is dense (no experts "
        "in its shape)"]


def test_layouts_the_one_process_paths_cannot_run_are_refused():
    from servelab.cli.eval_ppl import evaluate
    from servelab.cluster.build import validate_cluster

    with pytest.raises(ConfigError, match="pipeline_parallel_size=2 with cluster.prefill_replicas/decode_replicas"):
        validate_cluster(compose("model=tiny_moe", "pipeline_parallel_size=2", "cluster.prefill_replicas=1",
                                 "cluster.decode_replicas=1"))
    with pytest.raises(ConfigError, match="eval-ppl runs in one process: pipeline_parallel_size=2"):
        evaluate(compose("model=tiny_code", "pipeline_parallel_size=2"))
