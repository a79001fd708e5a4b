"""Data-parallel attention beside expert parallelism on backend=sim (``data_parallel_attention=true``)."""

from __future__ import annotations

import pytest

from conftest import compose
from servelab.assemble.executor import build_sim_executor
from servelab.assemble.stack import build_stack
from servelab.assemble.validate import validate
from servelab.core.errors import ConfigError
from servelab.core.step_work import StepWork
from servelab.sim.dp_attention import slowest_rank_work

EP8 = ("backend=sim", "model=qwen3_30b_a3b", "tensor_parallel_size=8", "expert_parallel_size=8")
DP = "data_parallel_attention=true"


def decode(batch: int, context: int = 512) -> StepWork:
    return StepWork(num_tokens=batch, num_seqs=batch, decode_seqs=batch, num_sampled=batch,
                    attended=batch * context, context_tokens=batch * context)


def test_a_decode_step_is_spread_evenly_and_the_fullest_rank_sets_the_share():
    rank = slowest_rank_work(decode(20), 8)
    assert (rank.num_tokens, rank.num_seqs, rank.num_sampled) == (3, 3, 3)
    assert rank.context_tokens == 3 * 512 and rank.attended == 3 * 512


def test_a_prompt_chunk_stays_whole_on_one_rank():
    step = StepWork(num_tokens=2000 + 63, num_seqs=64, prefill_tokens=2000, decode_seqs=63, num_sampled=64,
                    attended=2000 * 1000 + 63 * 512, context_tokens=2000 + 63 * 512)
    rank = slowest_rank_work(step, 8)
    assert rank.num_tokens == 2000 and rank.num_seqs == 8
    assert slowest_rank_work(step, 1) is step


def test_the_kv_pool_grows_and_the_attention_weights_are_replicated():
    tp = build_sim_executor(compose(*EP8)).summary()
    dp = build_sim_executor(compose(*EP8, DP)).summary()
    assert dp["sim_weight_bytes_per_rank"] > tp["sim_weight_bytes_per_rank"]  # attention, router, embeddings x 8
    # 4 KV heads: TP 8 replicates one head per rank; DP holds each token's 4 heads once over 8 ranks (2x tokens)
    assert dp["sim_attention_dp_ranks"] == 8 and dp["sim_kv_pool_bytes_total"] == pytest.approx(
        8 * dp["sim_kv_pool_bytes_per_rank"])
    assert "sim_attention_dp_ranks" not in tp


def test_mla_latent_kv_is_no_longer_replicated_over_the_ranks():
    common = ("backend=sim", "model=deepseek_v3", "model.quantization=int8", "hardware=h200",
              "tensor_parallel_size=8", "expert_parallel_size=8")
    tp, dp = build_sim_executor(compose(*common)), build_sim_executor(compose(*common, DP))
    # 8 ranks each holding its own latents, less the room the replicated attention and embeddings take
    assert 4 * tp.num_kv_blocks < dp.num_kv_blocks < 8 * tp.num_kv_blocks
    assert dp.bytes_per_block == tp.bytes_per_block  # the latent is the same on one rank


def test_a_decode_step_costs_the_slowest_ranks_attention_plus_every_ranks_experts():
    tp, dp = build_stack(compose(*EP8)).time_model, build_stack(compose(*EP8, DP)).time_model
    parts_tp, parts_dp = tp.breakdown(decode(64, 4096)), dp.breakdown(decode(64, 4096))
    assert parts_dp["communication"] == 0.0 < parts_tp["communication"]  # no attention all-reduce
    # TP 8 reads 64 sequences' one replicated KV head (of 4) per rank; DP 8 reads 8 sequences' 4 heads: half the bytes
    assert 0.4 * parts_tp["attention"] < parts_dp["attention"] < 0.7 * parts_tp["attention"]
    assert parts_dp["all_to_all"] > 0 and parts_dp["experts"] > 0
    dp.predict(decode(64))
    summary = dp.timing_summary()
    assert summary["dp_attention_ranks"] == 8 and summary["dp_attention_mean_rank_imbalance"] == 1.0
    assert "dp_attention_ranks" not in tp.timing_summary()


def test_the_banner_row_says_attention_is_data_parallel():
    label = build_stack(compose(*EP8, DP)).time_model.moe_label
    assert "attention data-parallel over 8 ranks" in label and "10.3 GB per rank" in label


@pytest.mark.parametrize(("overrides", "match"), [
    ((*EP8[:-1], DP), "needs expert_parallel_size > 1"),
    (("backend=sim", "model=llama3_8b", "tensor_parallel_size=2", "expert_parallel_size=2", DP), "mixture-of-experts"),
    ((*EP8, DP, "sim.moe.ep_exchange=all_reduce"), "sim.moe.ep_exchange=all_to_all"),
    ((*EP8, DP, "time_model=roofline"), "time_model=roofline"),
    (("backend=tp", *EP8[1:], DP), "backend=sim"),
])
def test_invalid_combinations_are_one_line_naming_the_key(overrides, match):
    with pytest.raises(ConfigError, match=match) as err:
        validate(compose(*overrides))
    assert "data_parallel_attention=true" in str(err.value) and "\n" not in str(err.value)
