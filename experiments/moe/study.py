"""Mixture-of-experts serving in the simulator (issue 46): tensor against expert parallelism, expert
placement (EPLB) under skewed routing, MLA's latent KV against ordinary attention, and expert offloading
(``expert_cache``: lru / lfu / prefetch against all experts resident on one GPU).

    python experiments/moe/study.py --update-readme    # experiments/moe/{README.md,results.json}
    python experiments/moe/study.py                    # the same, results under multirun/moe/
    python experiments/moe/study.py --update-readme --only offload   # one section; the rest from results.json

Every run is the simulator (virtual clock, ``time_model=auto``: the calibrated roofline for the experts
a step touches, DeepEP's measured all-to-all for EP): numbers are engine time, a deterministic
function of config + workload + seed. The last section is a dense model: Llama-3-70B at TP 4 x PP 2
against TP 8 (pipeline parallelism).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent

COMMON = ["backend=sim", "logger=none", "progress=false"]
QWEN = COMMON + ["model=qwen3_30b_a3b", "hardware=h100", "tensor_parallel_size=8", "workload=synthetic",
                 "workload.num_requests=300", "workload.rate=30"]
SKEW = 1.2  # Zipf exponent of expert popularity in the EPLB rows (sim.moe.routing_skew)
EPLB = ["expert_placement=eplb", "expert_placement.step_interval=200", "expert_placement.window_size=100"]
# prefill-heavy: long prompts, short answers (steps of thousands of tokens, where expert compute dominates)
LONG = QWEN[:-2] + ["workload.num_requests=200", "workload.rate=6", "workload.prompt_len.min=2048",
                    "workload.prompt_len.max=8192", "workload.output_len.min=8", "workload.output_len.max=64",
                    "expert_parallel_size=8"]
DEEPSEEK = COMMON + ["model=deepseek_v3", "model.quantization=int8", "hardware=h200", "tensor_parallel_size=8",
                     "expert_parallel_size=8", "workload=chat_sessions", "allocator.prefix_caching=true",
                     "workload.num_sessions=240", "workload.session_rate=4"]


# a dense 70B past one GPU's memory: TP 8 against TP 4 x PP 2 on the same 8 x H100 (pipeline_parallel_size)
LLAMA70 = COMMON + ["model=llama3_70b", "hardware=h100", "workload=synthetic", "workload.num_requests=400",
                    "workload.prompt_len.min=512", "workload.prompt_len.max=2048", "workload.output_len.min=64",
                    "workload.output_len.max=512"]
PP2 = ["tensor_parallel_size=4", "pipeline_parallel_size=2"]


def _run(overrides: list[str]) -> dict:
    from servelab.api import compose
    from servelab.run.session import run_job

    with tempfile.TemporaryDirectory() as out:
        return run_job(compose(overrides), out).summary


def _row(label: str, overrides: list[str], s: dict | None = None) -> dict:
    s = s or _run(overrides)
    return {"label": label, "overrides": overrides[len(COMMON):],
            "tpot_p50_ms": s["tpot_ms"]["p50"], "tpot_p99_ms": s["tpot_ms"]["p99"],
            "ttft_p50_ms": s["ttft_ms"]["p50"], "ttft_p99_ms": s["ttft_ms"]["p99"],
            "output_tok_s": s["output_throughput_tok_s"], "imbalance_mean": s.get("moe_mean_group_imbalance"),
            "imbalance_max": s.get("moe_max_group_imbalance"),
            "imbalance_tokens": s.get("moe_token_weighted_group_imbalance"), "experts_touched": s.get("moe_mean_experts_touched"),
            "replans": s.get("moe_placement_replans", 0), "replicas_moved": s.get("moe_replicas_moved", 0),
            "move_s": s.get("moe_replica_move_s", 0.0), "weights_gb": s["sim_weight_bytes_per_rank"] / 1e9,
            "kv_pool_gb": s["sim_kv_pool_bytes_per_rank"] / 1e9, "kv_blocks": s["num_kv_blocks"],
            "prefix_hit": s.get("prefix_cache_hit_rate"), "prefill_tokens": s.get("prefill_tokens_computed"),
            "preemptions": s.get("num_preemptions", 0), "requests": s["num_requests"]}


def _pp_row(label: str, overrides: list[str]) -> dict:
    s = _run(overrides)
    return {"label": label, "overrides": overrides[len(COMMON):],
            "tpot_p50_ms": s["tpot_ms"]["p50"], "tpot_p99_ms": s["tpot_ms"]["p99"],
            "ttft_p50_ms": s["ttft_ms"]["p50"], "ttft_p99_ms": s["ttft_ms"]["p99"],
            "output_tok_s": s["output_throughput_tok_s"], "bubble": s.get("pipeline_bubble_share", 0.0),
            "weights_gb": s["sim_weight_bytes_per_rank"] / 1e9, "kv_pool_gb": s["sim_kv_pool_bytes_per_rank"] / 1e9,
            "kv_blocks": s["num_kv_blocks"], "requests": s["num_requests"]}


def pipeline_section() -> dict:
    """Dense Llama-3-70B on 8 x H100: TP 8 against TP 4 x PP 2 (one node; two 4-GPU nodes), TP 4 alone for the
    pool, at 4 req/s; and at 8 req/s with vLLM's per-batch limits (a PP round holds two batches' worth)."""
    moderate = LLAMA70 + ["workload.rate=4"]
    heavy = LLAMA70 + ["workload.rate=8"]
    return {"pipeline": [_pp_row("TP 8", moderate + ["tensor_parallel_size=8"]),
                         _pp_row("TP 4 x PP 2, one node (NVLink hop)", moderate + PP2),
                         _pp_row("TP 4 x PP 2, two 4-GPU nodes (network hop)", moderate + PP2 +
                                 ["cluster.gpus_per_node=4"]),
                         _pp_row("TP 4 alone (4 GPUs: the pool without stages)", moderate + ["tensor_parallel_size=4"])],
            "pipeline_heavy": [_pp_row("TP 8, max_num_seqs=128, max_num_batched_tokens=4096",
                                       heavy + ["tensor_parallel_size=8", "max_num_seqs=128",
                                                "max_num_batched_tokens=4096"]),
                               _pp_row("TP 4 x PP 2, two batches of 128 / 4096 in flight (round 256 / 8192)",
                                       heavy + PP2 + ["max_num_seqs=256", "max_num_batched_tokens=8192"]),
                               _pp_row("TP 4 x PP 2, round 128 / 4096 (one batch's limits split in two)",
                                       heavy + PP2 + ["max_num_seqs=128", "max_num_batched_tokens=4096"])]}


def study() -> dict:
    out: dict = {}
    out["parallel"] = [_row(label, QWEN + [f"expert_parallel_size={ep}"]) for label, ep in
                       (("TP 8 (experts sharded 8 ways)", 1), ("TP 8 + EP 2", 2), ("TP 8 + EP 4", 4),
                        ("EP 8 (attention TP 8)", 8))] + \
        [_row("DP attention 8 + EP 8", QWEN + ["expert_parallel_size=8", "data_parallel_attention=true"])]
    skewed = LONG + [f"sim.moe.routing_skew={SKEW}"]
    out["placement"] = [_row("uniform routing, linear", LONG),
                        _row(f"skew {SKEW}, linear", skewed),
                        _row(f"skew {SKEW}, round_robin", skewed + ["expert_placement=round_robin"]),
                        _row(f"skew {SKEW}, eplb, no redundant experts", skewed + EPLB),
                        _row(f"skew {SKEW}, eplb, 16 redundant experts", skewed + EPLB +
                             ["expert_placement.num_redundant_experts=16"]),
                        _row(f"skew {SKEW}, eplb, 16 redundant, placed once (no load)", skewed + [
                            "expert_placement=eplb", "expert_placement.num_redundant_experts=16",
                            "expert_placement.step_interval=0"])]
    decode = QWEN + ["expert_parallel_size=8", f"sim.moe.routing_skew={SKEW}"]
    out["placement_decode"] = [_row(f"skew {SKEW}, linear", decode),
                               _row(f"skew {SKEW}, eplb, 16 redundant experts", decode + EPLB +
                                    ["expert_placement.num_redundant_experts=16"])]
    out["attention"] = [_row("DeepSeek-V3, MLA (latent KV)", DEEPSEEK),
                        _row("the same, ordinary attention (128 KV heads x 192)", DEEPSEEK + ["model.kv_lora_rank=0"]),
                        _row("MLA, DP attention 8 + EP 8 (latent not replicated)", DEEPSEEK +
                             ["data_parallel_attention=true"])]
    for section in SECTIONS.values():
        out.update(section())
    return out


# expert offloading (expert_cache): one GPU that cannot hold every expert beside a useful KV pool
OFFLOAD = COMMON + ["model=qwen3_30b_a3b", "hardware=h100", "workload=synthetic", "workload.num_requests=100",
                    "workload.rate=0.5", f"sim.moe.routing_skew={SKEW}"]
MIXTRAL = COMMON + ["model=mixtral_8x7b", "workload=synthetic", "workload.num_requests=30", "workload.rate=0.1",
                    f"sim.moe.routing_skew={SKEW}"]


def _cache(name: str, slots: int, *more: str) -> list[str]:
    return [f"expert_cache={name}", f"sim.moe.expert_cache_slots={slots}", *more]


def _offload_row(label: str, overrides: list[str]) -> dict:
    s = _run(overrides)
    row = _row(label, overrides, s)
    row.update({k.removeprefix("moe_expert_cache_"): s.get(k) for k in (
        "moe_expert_cache_hit_rate", "moe_expert_cache_stall_s", "moe_expert_cache_bytes_loaded",
        "moe_expert_cache_lookahead_loads", "moe_expert_cache_lookahead_right")})
    row["loaded_gb"] = (row.pop("bytes_loaded") or 0.0) / 1e9
    return row


def offload() -> list[dict]:
    """Expert offloading: all resident against lru / lfu / prefetch caches of half (and a quarter of) the experts."""
    h100 = ["hardware=h100"]
    return [_offload_row("Qwen3-30B-A3B, all resident (expert_cache=none)", OFFLOAD),
            _offload_row("Qwen3-30B-A3B, lru 64 of 128", OFFLOAD + _cache("lru", 64)),
            _offload_row("Qwen3-30B-A3B, lfu 64 of 128", OFFLOAD + _cache("lfu", 64)),
            _offload_row("Qwen3-30B-A3B, prefetch 64 of 128 (recall 0.8)", OFFLOAD + _cache("prefetch", 64)),
            _offload_row("Qwen3-30B-A3B, prefetch 64 of 128 (recall 1: exact pre-gate)",
                         OFFLOAD + _cache("prefetch", 64, "expert_cache.recall=1.0")),
            _offload_row("Qwen3-30B-A3B, lfu 32 of 128", OFFLOAD + _cache("lfu", 32)),
            _offload_row("Qwen3-30B-A3B, lfu 64 of 128, uniform routing",
                         OFFLOAD[:-1] + ["sim.moe.routing_skew=0"] + _cache("lfu", 64)),
            _offload_row("Mixtral-8x7B on H200, all resident (does not fit one H100)", MIXTRAL + ["hardware=h200"]),
            _offload_row("Mixtral-8x7B on H100, lru 4 of 8", MIXTRAL + h100 + _cache("lru", 4)),
            _offload_row("Mixtral-8x7B on H100, lfu 4 of 8", MIXTRAL + h100 + _cache("lfu", 4)),
            _offload_row("Mixtral-8x7B on H100, prefetch 4 of 8 (recall 0.8)", MIXTRAL + h100 + _cache("prefetch", 4)),
            _offload_row("Mixtral-8x7B on H100, prefetch 4 of 8 (recall 1)",
                         MIXTRAL + h100 + _cache("prefetch", 4, "expert_cache.recall=1.0"))]


#: --only <name>: rerun that section (each returns its results.json keys), the others kept from results.json
SECTIONS = {"pipeline": pipeline_section, "offload": lambda: {"offload": offload()}}


def _f(x, spec=".2f") -> str:
    return "-" if x is None else format(x, spec)


def _table(rows: list[dict], cols: list[tuple[str, str, str]]) -> str:
    lines = ["| run | " + " | ".join(c[0] for c in cols) + " |", "|---|" + "---|" * len(cols)]
    lines += ["| " + r["label"] + " | " + " | ".join(_f(r[c[1]], c[2]) for c in cols) + " |" for r in rows]
    return "\n".join(lines)


LATENCY = [("TPOT p50 ms", "tpot_p50_ms", ".2f"), ("TPOT p99 ms", "tpot_p99_ms", ".2f"),
           ("TTFT p99 ms", "ttft_p99_ms", ".1f"), ("output tok/s", "output_tok_s", ".0f")]
PARALLEL = LATENCY + [("imbalance mean", "imbalance_mean", ".2f"), ("weights GB/rank", "weights_gb", ".1f"),
                      ("KV pool GB/rank", "kv_pool_gb", ".1f"), ("KV blocks (all ranks)", "kv_blocks", ",d")]
PLACEMENT = LATENCY + [("imbalance mean", "imbalance_mean", ".2f"), ("per token", "imbalance_tokens", ".3f"),
                       ("imbalance max", "imbalance_max", ".2f"),
                       ("re-plans", "replans", "d"), ("replicas moved", "replicas_moved", ",d"),
                       ("moves s", "move_s", ".3f"), ("KV pool GB/rank", "kv_pool_gb", ".2f")]
OFFLOAD_COLS = [("TPOT p50 ms", "tpot_p50_ms", ".1f"), ("TPOT p99 ms", "tpot_p99_ms", ".1f"),
                ("TTFT p99 ms", "ttft_p99_ms", ".0f"), ("hit rate", "hit_rate", ".1%"),
                ("stall s", "stall_s", ".1f"), ("loaded GB", "loaded_gb", ",.0f"),
                ("weights GB", "weights_gb", ".1f"), ("KV pool GB", "kv_pool_gb", ".1f")]
ATTENTION = [("KV pool GB/rank", "kv_pool_gb", ".1f"), ("KV blocks", "kv_blocks", ",d"),
             ("prefix hit", "prefix_hit", ".1%"), ("prefill tokens", "prefill_tokens", ",d"),
             ("preemptions", "preemptions", ",d"), ("TTFT p50 ms", "ttft_p50_ms", ".0f"),
             ("TTFT p99 ms", "ttft_p99_ms", ".0f"), ("TPOT p50 ms", "tpot_p50_ms", ".2f")]


PIPELINE = [("TPOT p50 ms", "tpot_p50_ms", ".1f"), ("TPOT p99 ms", "tpot_p99_ms", ".1f"),
            ("TTFT p50 ms", "ttft_p50_ms", ".0f"), ("TTFT p99 ms", "ttft_p99_ms", ".0f"),
            ("output tok/s", "output_tok_s", ".0f"), ("bubble", "bubble", ".1%"), ("weights GB/rank", "weights_gb", ".1f"),
            ("KV pool GB/rank", "kv_pool_gb", ".1f"), ("KV blocks", "kv_blocks", ",d")]


def pipeline_findings(res: dict) -> list[str]:
    tp8, pp, pp_net, tp4 = res["pipeline"]
    h_tp8, h_pp, h_pp_split = res["pipeline_heavy"]
    return [
        f"Dense Llama-3-70B at 4 req/s on 8 x H100: TP 4 x PP 2 holds the same weights per rank as TP 8 "
        f"({pp['weights_gb']:.1f} against {tp8['weights_gb']:.1f} GB) and so the same pool ({pp['kv_blocks']:,} "
        f"against {tp8['kv_blocks']:,} blocks), {pp['kv_blocks'] / tp4['kv_blocks']:.1f}x TP 4 alone: each stage keeps "
        f"only its 40 layers' KV. Its TPOT p50 is {pp['tpot_p50_ms']:.1f} ms against {tp8['tpot_p50_ms']:.1f} "
        f"({pp['tpot_p50_ms'] / tp8['tpot_p50_ms']:.2f}x; TP 4 alone {tp4['tpot_p50_ms']:.1f}): every token crosses "
        "both stages at TP 4 in series, and at this load the decode micro-batches are memory-bound, so each reads its "
        f"stage's weights once per micro-batch. Throughput is close to the offered load in both ({pp['output_tok_s']:.0f} "
        f"against {tp8['output_tok_s']:.0f} tok/s); {pp['bubble']:.1%} of the stages' time is bubble (transfers, the "
        "host in each micro-batch's loop, and rounds whose prompt chunk sits in one micro-batch).",
        f"The same stages on two 4-GPU nodes: TPOT p50 {pp_net['tpot_p50_ms']:.1f} against {pp['tpot_p50_ms']:.1f} ms "
        "on one node: a hop carries 2 x 8,192 x 2 bytes per token (hidden states and residual), 32 KB for a decode, "
        "so even the 50 GB/s network adds tens of microseconds per round. PP's case across nodes is that only "
        "this crosses the network where TP 8 over two nodes would all-reduce twice per layer (refused here: a "
        "tensor-parallel group stays on one node).",
        f"At 8 req/s with vLLM's per-batch limits (TP 8 at max_num_seqs=128; PP 2 running two such batches): "
        f"{h_pp['output_tok_s']:.0f} against {h_tp8['output_tok_s']:.0f} tok/s "
        f"({h_pp['output_tok_s'] / h_tp8['output_tok_s']:.2f}x), TPOT p50 {h_pp['tpot_p50_ms']:.1f} against "
        f"{h_tp8['tpot_p50_ms']:.1f} ms, TTFT p99 {h_pp['ttft_p99_ms']:.0f} against {h_tp8['ttft_p99_ms']:.0f} ms. "
        f"Held to one batch's limits for the whole round, PP 2 queues: TTFT p99 {h_pp_split['ttft_p99_ms']:.0f} ms, "
        f"{h_pp_split['output_tok_s']:.0f} tok/s.",
    ]


def findings(res: dict) -> list[str]:
    tp, ep2, ep4, ep, dp = res["parallel"]
    uniform, linear, rr, eplb0, eplb, once = res["placement"]
    dec_linear, dec_eplb = res["placement_decode"]
    mla, mha, mla_dp = res["attention"]
    shards = eplb["replicas_moved"] / max(eplb["replans"], 1) / 8
    return [
        f"At 30 req/s on 8 x H100 (decode-heavy), TP 8 alone gives TPOT p50 {tp['tpot_p50_ms']:.2f} ms; every EP "
        f"layout is slower ({ep2['tpot_p50_ms']:.2f} / {ep4['tpot_p50_ms']:.2f} / {ep['tpot_p50_ms']:.2f} ms at EP "
        "2 / 4 / 8): at these batches a MoE layer's dispatch + combine (DeepEP's measured bandwidth plus a link "
        "latency each) costs more than the all-reduce it replaces, and the most loaded rank sets the layer "
        f"(imbalance {ep2['imbalance_mean']:.2f} / {ep4['imbalance_mean']:.2f} / {ep['imbalance_mean']:.2f} under "
        "uniform routing: sampling noise alone). Weights per rank are the same in every layout (1/8 of every expert).",
        f"Prefill-heavy load, EP 8: routing skew {SKEW} raises the token-weighted imbalance "
        f"{uniform['imbalance_tokens']:.3f} -> {linear['imbalance_tokens']:.3f} and TTFT p99 "
        f"{uniform['ttft_p99_ms']:.1f} -> {linear['ttft_p99_ms']:.1f} ms; round_robin changes little "
        f"({rr['imbalance_tokens']:.3f}): the simulated hot experts are random ids, not neighbours.",
        f"EPLB re-planned every 200 steps brings the token-weighted imbalance to {eplb0['imbalance_tokens']:.3f} "
        f"(no redundant experts) and {eplb['imbalance_tokens']:.3f} (16 redundant), TTFT p99 "
        f"{linear['ttft_p99_ms']:.1f} -> {eplb0['ttft_p99_ms']:.1f} / {eplb['ttft_p99_ms']:.1f} ms and TPOT p99 "
        f"{linear['tpot_p99_ms']:.2f} -> {eplb0['tpot_p99_ms']:.2f} / {eplb['tpot_p99_ms']:.2f} ms; placed once "
        f"without measured load it does nothing ({once['imbalance_tokens']:.3f}). The per-step mean imbalance "
        f"moves less ({linear['imbalance_mean']:.2f} -> {eplb['imbalance_mean']:.2f}): most steps are small decode "
        "steps whose imbalance is how a few tokens' 8 experts collide on ranks, which no placement removes (SGLang's "
        "EPLB write-up says the same: larger batches reduce the fluctuations EPLB cannot).",
        f"Each EPLB re-plan packs from scratch and moves about {shards:,.0f} expert shards per rank "
        f"({eplb['move_s'] / max(eplb['replans'], 1) * 1e3:.1f} ms over NVLink, {eplb['move_s']:.3f} s in all): "
        "the window's noisy load reshuffles the packing. A migration-aware re-plan would move far fewer. Its 16 "
        f"replicas cost {linear['kv_pool_gb'] - eplb['kv_pool_gb']:.2f} GB of KV pool per rank.",
        f"Decode-heavy load (30 req/s), EP 8, skew {SKEW}: EPLB with 16 redundant experts gives TPOT p99 "
        f"{dec_linear['tpot_p99_ms']:.2f} -> {dec_eplb['tpot_p99_ms']:.2f} ms although the token-weighted imbalance "
        f"falls {dec_linear['imbalance_tokens']:.3f} -> {dec_eplb['imbalance_tokens']:.3f}: decode experts are "
        "weight-bound, so a hot expert split over replicas is read once per replica, while the token balance barely "
        f"matters; and each of the {dec_eplb['replans']} re-plans stalls a step "
        f"{dec_eplb['move_s'] / max(dec_eplb['replans'], 1) * 1e3:.0f} ms.",
        f"Data-parallel attention beside EP 8 (same load): TPOT p50 {dp['tpot_p50_ms']:.2f} ms against "
        f"{ep['tpot_p50_ms']:.2f} (EP 8, attention TP 8) and {tp['tpot_p50_ms']:.2f} (TP 8): no attention "
        "all-reduce, and each rank reads only its own sequences' 4 KV heads where TP 8 reads every sequence's one "
        "replicated head; the experts still see all ranks' tokens through the all-to-all. It costs weights: "
        f"{dp['weights_gb']:.1f} GB per rank against {ep['weights_gb']:.1f} (attention, router, embeddings "
        f"replicated), and the pool per rank shrinks to {dp['kv_pool_gb']:.1f} GB but holds {dp['kv_blocks']:,} "
        f"blocks in all against {ep['kv_blocks']:,}.",
        f"DeepSeek-V3 with DP attention: {mla_dp['kv_blocks']:,} KV blocks against {mla['kv_blocks']:,} under "
        f"TP 8 ({mla_dp['kv_blocks'] / mla['kv_blocks']:.1f}x, not 8x: the replicated attention weights take "
        f"{mla_dp['weights_gb'] - mla['weights_gb']:.1f} GB per rank); TTFT p99 {mla['ttft_p99_ms']:.0f} -> "
        f"{mla_dp['ttft_p99_ms']:.0f} ms, TPOT p50 {mla['tpot_p50_ms']:.2f} -> {mla_dp['tpot_p50_ms']:.2f} ms, "
        f"preemptions {mla['preemptions']} -> {mla_dp['preemptions']}: at 4 sessions/s the pool was not the limit, "
        "and under DP attention a prompt chunk runs whole on one rank at TP 1 (its attention projections, with "
        "MLA priced at the ordinary q/k/v widths, and DeepSeek's three dense layers), so long chunks set the step. "
        "DP attention pays where the batch is large enough to fill every rank (SGLang's large-scale EP "
        "setting), which this load is not.",
        f"DeepSeek-V3's latent KV holds {mla['kv_blocks']:,} blocks per rank against {mha['kv_blocks']:,} with "
        f"ordinary attention ({mla['kv_blocks'] / mha['kv_blocks']:.1f}x; the KV bytes alone 10.7x, the rest is the "
        "larger attention weights of the MHA variant); on "
        f"{mla['requests']} chat turns the prefix hit rate is {mla['prefix_hit']:.1%} against {mha['prefix_hit']:.1%}, "
        f"the prefill tokens computed {mla['prefill_tokens']:,} against {mha['prefill_tokens']:,}, and the ordinary "
        f"pool preempts {mha['preemptions']} times (TTFT p50 {mla['ttft_p50_ms']:.0f} against "
        f"{mha['ttft_p50_ms']:.0f} ms).",
    ]


def offload_findings(res: dict) -> list[str]:
    rows = {r["label"].split(", ", 1)[1] if r["label"].startswith("Qwen") else r["label"]: r for r in res["offload"]}
    none, lru, lfu = rows["all resident (expert_cache=none)"], rows["lru 64 of 128"], rows["lfu 64 of 128"]
    pf, exact = rows["prefetch 64 of 128 (recall 0.8)"], rows["prefetch 64 of 128 (recall 1: exact pre-gate)"]
    quarter, uniform = rows["lfu 32 of 128"], rows["lfu 64 of 128, uniform routing"]
    m_lfu, m_pf = rows["Mixtral-8x7B on H100, lfu 4 of 8"], rows["Mixtral-8x7B on H100, prefetch 4 of 8 (recall 0.8)"]
    m_exact, m_lru = rows["Mixtral-8x7B on H100, prefetch 4 of 8 (recall 1)"], rows["Mixtral-8x7B on H100, lru 4 of 8"]
    return [
        f"Offloading half of Qwen3-30B-A3B's experts frees {none['weights_gb'] - lfu['weights_gb']:.1f} GB on one "
        f"H100: the KV pool grows {none['kv_pool_gb']:.1f} -> {lfu['kv_pool_gb']:.1f} GB, and TPOT p50 rises "
        f"{none['tpot_p50_ms']:.1f} -> {lru['tpot_p50_ms']:.1f} (lru) / {lfu['tpot_p50_ms']:.1f} ms (lfu): each "
        "miss is a 9.4 MB shard over 64 GB/s PCIe (0.15 ms) against about 0.1 ms of compute per layer, so a "
        "decode step is bound by the host link, not by the GPU.",
        f"Under skew {SKEW} lfu beats lru (hit rate {lfu['hit_rate']:.1%} against {lru['hit_rate']:.1%}): the hot "
        "experts stay hot for the whole run, and LRU evicts them for cold ones a batch happened to touch. Under "
        f"uniform routing the same cache hits {uniform['hit_rate']:.1%} (about its 50% share) and TPOT p50 is "
        f"{uniform['tpot_p50_ms']:.1f} ms: caching pays only with skew. A quarter of the experts resident: "
        f"hit rate {quarter['hit_rate']:.1%}, TPOT p50 {quarter['tpot_p50_ms']:.1f} ms.",
        f"Speculative loading one layer ahead (prefetch) cuts TPOT p50 {lfu['tpot_p50_ms']:.1f} -> "
        f"{pf['tpot_p50_ms']:.1f} ms at recall 0.8 and {exact['tpot_p50_ms']:.1f} ms with an exact pre-gate: a load "
        "can hide only behind the compute before its layer, and the link, not the GPU, is busy. On Mixtral "
        f"(a 352 MB shard, 5.5 ms a load) prefetch at recall 0.8 is worse than lfu ({m_pf['tpot_p50_ms']:.0f} "
        f"against {m_lfu['tpot_p50_ms']:.0f} ms): its wrong guesses occupy the link ahead of the misses they "
        f"leave; with exact guesses it is {m_exact['tpot_p50_ms']:.0f} ms. Mixtral-8x7B with half its experts "
        f"offloaded: TPOT p50 {m_lru['tpot_p50_ms']:.0f} (lru) / {m_lfu['tpot_p50_ms']:.0f} ms (lfu), i.e. "
        f"{1000 / m_lfu['tpot_p50_ms']:.1f} tokens/s per sequence.",
    ]


def page(res: dict, wall: float, command: str) -> str:
    return f"""# Mixture-of-experts serving: TP vs EP, expert placement, MLA (simulated)

Regenerate: `{command}` ({wall:.0f} s wall on a shared 2-core box). Every number is the simulator's
(`backend=sim`, virtual clock, `time_model=auto`: the experts each step's tokens touch priced by the
calibrated roofline, EP's dispatch/combine from DeepEP's published bandwidths); results.json has every
row with its overrides. Routing is drawn (`sim.moe.routing_skew`: Zipf popularity, hot experts random
per layer), not replayed from a real model's trace.

## What matches published numbers and what does not

- **MLA's KV per token** matches by construction: DeepSeek-V2 (arXiv:2405.04434, Table 1) gives MLA
  `(d_c + d_R) l = 576 l` elements against MHA's `2 n_h d_h l`. The MHA variant here
  (`model.kv_lora_rank=0`) uses the preset's 192-wide heads for K and V, about 20% above DeepSeek's V
  width of 128. Under TP 8 MLA's latent is replicated on every rank (as vLLM runs it), so the per-rank
  gain is 10.7x in KV bytes, not the ~57x of one GPU.
- **EPLB**: SGLang's large-scale EP study (lmsys.org/blog/2025-05-05-large-scale-ep, "Overall
  Throughput") measured DeepSeek-V3 prefill on 4 x 8 H100 (EP 32) at 50,302 tokens/s per node with the
  default expert distribution against 59,337 with a simulated perfect EPLB (+18%), and states that larger
  batches reduce the fluctuations EPLB cannot fix. The direction matches here (the gain shows on large
  prefill steps, not on decode); the magnitude is not comparable (one node, EP 8, Qwen3-30B-A3B, drawn
  Zipf routing) and is not validated.
- **round_robin** does not match: vLLM PR #28449 reports +14.6% throughput and -13.4% TPOT for
  round-robin over linear placement on DeepSeek-R1 (2 x 8 H20, DeepEP low-latency). Here the two are
  equal, because drawn routing has no locality in expert ids for either placement to meet; a routing
  trace from the real model (`sim.moe.routing_trace`) would be needed.
- **TP vs EP**: no published single-node Qwen3-30B-A3B TP-vs-EP serving measurement was found; SGLang's
  and vLLM's guides recommend EP for large multi-node MoE, which this single-node, moderate-load study
  neither confirms nor contradicts. Treat the rows as the model's prediction.
- **DP attention + EP**: SGLang's large-scale EP blog (lmsys.org/blog/2025-05-05-large-scale-ep) runs
  DeepSeek-V3 with DP attention precisely to stop replicating MLA's latent KV over TP ranks; the direction
  (a several-times larger pool for MLA, none of the TP all-reduces) matches; no single-node figure to
  compare the magnitudes with was found. The simulator spreads the engine's batch over the ranks from the
  step's sums (docs/simulator.md), one pool of all ranks' blocks, so rank imbalance of KV is not modelled.
- **Pipeline parallelism (TP 4 x PP 2 against TP 8)**: no published measurement of this pair on one H100
  node with its workload stated was found, so no fidelity row (validation only; none forced). What the
  direction can be checked against: TensorRT-LLM issue #1144 (LLaMA-13B, 4 x A100 40GB, 3 req/s) measured
  p90 latency 10.2 s at PP 2 x TP 2 against 6.4 s at TP 4, and its maintainers answer that PP does not
  help latency and splits small batches into micro-batches; the rows here show the same (TPOT above TP 8's,
  throughput only close under load). vLLM issue #8089 reports Llama-3-70B not scaling past TP 4, which the
  op tables here echo (TP 8's lone decode is 1.5x faster than TP 4's, not 2x). Sarathi-Serve (OSDI'24)
  evaluates Falcon-180B at TP 4 x PP 2 over two nodes and attributes PP's losses to bubbles from
  non-uniform batches, the term this model prices; its figures compare schedulers, not layouts, and are not
  compared here. The vLLM-like limits under PP are an assumption stated with the rows.

## TP vs EP vs TP + EP: Qwen3-30B-A3B on 8 x H100, 300 requests at 30 req/s, uniform routing

EP `n` with TP 8: attention over 8 ranks, each expert on `8 / n` of them (`expert_parallel_size=n`).
DP attention (`data_parallel_attention=true`): each of the 8 ranks runs attention on its own sequences with
whole weights and KV, the experts EP 8; the KV blocks are the engine's pool (under DP attention the 8 ranks'
pools together; one block is one rank's).

{_table(res['parallel'], PARALLEL)}

## Expert placement under skewed routing: Qwen3-30B-A3B, EP 8 on H100, prefill-heavy

200 requests at 6 req/s, prompts 2,048-8,192 tokens, answers 8-64. Imbalance: the most loaded rank's
tokens over the mean rank's, per MoE layer and step: the mean over steps, the mean weighted by the
step's tokens ("per token"), and the worst step. `eplb` re-plans every 200 steps from the last 100
steps' load; moved shards are priced over NVLink and charged to the re-planning step.

{_table(res['placement'], PLACEMENT)}

The same under the decode-heavy load of the first table (30 req/s):

{_table(res['placement_decode'], PLACEMENT)}

## MLA against ordinary attention: DeepSeek-V3 (INT8 weights standing in for FP8) on 8 x H200, EP 8, prefix caching

`workload=chat_sessions`, 240 sessions at 4 sessions/s (every turn repeats its conversation).

{_table(res['attention'], ATTENTION)}

## Dense Llama-3-70B: TP 4 x PP 2 against TP 8 on 8 x H100

`pipeline_parallel_size=2`: two stages of 40 layers on 4 ranks each, two batches in flight, a round priced as
docs/simulator.md states (serial stages, the activation hop, bubbles). 400 requests, prompts 512-2,048,
answers 64-512 tokens. At 4 req/s (the engine's default limits, which this load does not reach):

{_table(res['pipeline'], PIPELINE)}

At 8 req/s, with vLLM's limits taken per batch in flight (a PP round holds two batches):

{_table(res['pipeline_heavy'], PIPELINE)}

## Expert offloading: one GPU, experts in host memory (`expert_cache`)

Qwen3-30B-A3B on one H100 (its 61 GB of BF16 weights fit, leaving 8.9 GB of KV pool), 100 requests at
0.5 req/s, routing skew {SKEW}; Mixtral-8x7B (93 GB: does not fit one H100) at 30 requests at 0.1 req/s,
skew {SKEW}, against all experts resident on one H200. `sim.moe.expert_cache_slots`: experts per MoE layer
kept on the GPU, the rest loaded over PCIe (64 GB/s per direction) when routed to. Hit rate: routed experts
that were resident; stall: the seconds layers waited for loads, summed over the run; loaded: bytes over
the host link. `prefetch` keeps LFU's set and guesses each layer's misses one layer early (recall: the
share of guesses that are right; the wrong ones still cross the link).

{_table(res['offload'], OFFLOAD_COLS)}

What matches published observations and what does not:

- **The host link dominates** (matches): Fiddler (arXiv:2402.07033) measures that moving one Mixtral
  expert over PCIe takes longer than computing it on the CPU, and MoE-Infinity (arXiv:2401.14361) and
  Eliseev and Mazur (arXiv:2312.17238) report single-digit tokens/s for offloaded Mixtral; here the stall
  is most of every offloaded step and Mixtral decodes at a few tokens/s per sequence. CPU compute of missed
  experts (Fiddler's remedy) is not modelled.
- **Frequency beats recency under skew** (matches in direction): MoE-Infinity replaces LRU with
  activation-frequency priorities and reports higher hit rates; Eliseev and Mazur report 40-60% LRU hit
  rates on Mixtral with few experts cached. The simulator's routing is drawn i.i.d. per token (Zipf
  popularity, no per-sequence locality), so recency has nothing to exploit beyond popularity; with real
  routing (which has temporal locality) LRU would do better than here. A routing trace
  (`sim.moe.routing_trace`) from a real model would be needed to compare magnitudes.
- **Prefetch gains are modest** (matches the order): "Speculating Experts" (arXiv:2603.19289) reports up
  to 14% lower TPOT from layer-ahead speculative loading against on-demand loading; here {_f(
    (1 - res['offload'][3]['tpot_p50_ms'] / res['offload'][2]['tpot_p50_ms']) * 100, '.0f')}% at recall 0.8
  on Qwen3-30B-A3B. The window a load hides behind excludes the attention kernel (conservative).
- **LLMServingSim 2.0** models expert offloading with prefetch in the same terms (host-link transfers
  overlapped with compute); no per-configuration figure to compare with was found.

## Findings

""" + "\n".join(f"- {line}" for line in findings(res) + pipeline_findings(res) + offload_findings(res)) + "\n"


#: each section's findings (``--only`` prints that section's)
FINDINGS = {"pipeline": pipeline_findings, "offload": offload_findings}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--update-readme", action="store_true", help="write experiments/moe/{README.md,results.json}")
    parser.add_argument("--only", choices=sorted(SECTIONS), help="rerun this section only; the others come from "
                        "experiments/moe/results.json")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(REPO))
    import logging

    logging.disable(logging.WARNING)
    start = time.time()
    if args.only:
        res = json.loads((HERE / "results.json").read_text())
        res.update(SECTIONS[args.only]())
    else:
        res = study()
    wall = time.time() - start
    out = HERE if args.update_readme else REPO / "multirun" / "moe" / f"{datetime.now():%Y-%m-%d_%H-%M-%S}"
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(res, indent=1) + "\n")
    command = "python experiments/moe/study.py" + (" --update-readme" if args.update_readme else "") + \
        (f" --only {args.only}" if args.only else "")
    text = page(res, wall, command)
    if args.only:  # the page states the full command; this run redid one section
        text = text.replace(f"Regenerate: `{command}` ({wall:.0f} s wall", "Regenerate: `python experiments/moe/study.py "
                            f"--update-readme` (every section; `--only {args.only}` reran that one alone in {wall:.0f} s "
                            "wall", 1)
    (out / "README.md").write_text(text)
    print("\n".join(FINDINGS[args.only](res) if args.only else findings(res) + pipeline_findings(res) + offload_findings(res)))
    print(f"wrote {out / 'README.md'}")


if __name__ == "__main__":
    main()
