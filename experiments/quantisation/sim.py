"""Llama-3.1-70B in the simulator: does it fit, how much KV room is left, and how many requests per
second it serves within the SLOs, with and without quantisation, on A100-80GB and H100 at TP 1, 2, 4.

    python experiments/quantisation/sim.py                  # writes sim.json beside this script (~10 min)
    python experiments/quantisation/sim.py --no-capacity    # the memory table only (seconds)

Memory: ``backend=sim`` plans each rank's memory (``servelab.sim.executor.plan_memory``): device
memory x ``gpu_memory_utilization``, minus the rank's weights at their stored size (INT8 decoder
linears: 1 byte + a float32 scale per output channel; embeddings and LM head in bfloat16), minus
the activation reserve (2 GB), over the KV bytes of a block (quantised KV: 1 byte per value + a
float32 scale per token and KV head). Both utilisations (0.90, vLLM's default, and 0.95) are shown.

Capacity: the highest request rate of the Azure conversation trace slice (its own arrival
pattern, compressed or stretched) with p99 TTFT <= 2 s and p99 TPOT <= 100 ms, by bisection over
simulator runs on the virtual clock with ``time_model=calibrated_roofline`` for every setting (deterministic;
``auto`` would price bf16 from the op tables and INT8 by the calibrated roofline, mixing two models in one
comparison), one stack: FCFS,
chunked prefill (2048 tokens), recompute preemption, at utilisation 0.90. The search is
``experiments/capacity_search/search.py``'s.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
# One time model for every setting: auto would price bf16 from the measured op tables and INT8 by the
# calibrated roofline (the tables time float16 GEMMs), and the comparison would mix the two.
TIME_MODEL = "calibrated_roofline"
sys.path.insert(0, str(HERE.parent / "capacity_search"))

SETTINGS = {
    "bf16": [],
    "int8 weights": ["model.quantization=int8"],
    "int8 weights + int8 KV": ["model.quantization=int8", "kv_cache_dtype=int8"],
    "int8 weights + fp8 KV": ["model.quantization=int8", "kv_cache_dtype=fp8_e4m3"],
    "fp8 KV": ["kv_cache_dtype=fp8_e4m3"],
}
HARDWARE = ("a100_80gb", "h100")
TPS = (1, 2, 4)
UTILISATIONS = (0.9, 0.95)


def memory_row(hardware: str, tp: int, util: float, setting: str) -> dict:
    from servelab.api import compose
    from servelab.core.errors import ConfigError
    from servelab.assemble.executor import build_sim_executor, model_shape, storage_bytes

    cfg = compose(["backend=sim", "model=llama3_70b", f"hardware={hardware}", f"tensor_parallel_size={tp}",
                   f"backend.gpu_memory_utilization={util}", *SETTINGS[setting]], logger="none", progress=False)
    sizes = storage_bytes(cfg)
    shape = model_shape(cfg)
    weights = shape.weight_bytes_per_rank(sizes.weight, tp, sizes.linear)
    row = {"hardware": hardware, "tp": tp, "gpu_memory_utilization": util, "setting": setting,
           "weights_gb_per_rank": weights / 1e9, "weights_gb_total": weights * tp / 1e9,
           "usable_gb_per_rank": cfg.hardware.memory_gb * util,
           "kv_bytes_per_token_per_rank": shape.kv_bytes_per_token(sizes.kv, tp, sizes.kv_scale)}
    try:
        ex = build_sim_executor(cfg)
    except ConfigError:
        return {**row, "fits": False, "kv_gb_per_rank": None, "kv_blocks": 0, "kv_tokens": 0}
    return {**row, "fits": True, "kv_gb_per_rank": ex.num_kv_blocks * ex.bytes_per_block / 1e9,
            "kv_blocks": ex.num_kv_blocks, "kv_tokens": ex.num_kv_blocks * cfg.block_size}


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--no-capacity", action="store_true", help="only the memory table")
    p.add_argument("--num-requests", type=int, default=1000, help="trace slice for the capacity search")
    p.add_argument("--out", default=str(HERE / "sim.json"))
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    memory = [memory_row(hw, tp, util, s) for hw in HARDWARE for util in UTILISATIONS for tp in TPS for s in SETTINGS]
    for r in memory:
        print(f"{r['hardware']:10s} util {r['gpu_memory_utilization']:.2f} TP {r['tp']} {r['setting']:24s} "
              f"weights {r['weights_gb_per_rank']:6.1f} GB/rank  fits {r['fits']!s:5s} KV blocks {r['kv_blocks']}",
              flush=True)
    capacity = []
    if not args.no_capacity:
        import search  # experiments/capacity_search/search.py
        from servelab.api import compose
        from servelab.assemble.stack import build_stack
        from servelab.workloads.build import build_requests

        spec = search.StackSpec("fcfs", True, "recompute")
        for hw in HARDWARE:
            for tp in TPS:
                fitting = [r for r in memory if r["hardware"] == hw and r["tp"] == tp and r["fits"]
                           and r["gpu_memory_utilization"] == UTILISATIONS[0]]
                if not fitting:
                    continue
                base = search.parse_args(["--hardware", hw, "--num-requests", str(args.num_requests),
                                          "--time-model", TIME_MODEL])
                cfg = compose(search.base_overrides(base, tp) + SETTINGS[fitting[0]["setting"]], logger="none",
                              progress=False)
                stack = build_stack(cfg)
                requests = build_requests(cfg.workload, stack.executor.spec.vocab_size, stack.limits.max_model_len)
                stack.executor.shutdown()
                native, _ = search.slice_rate(requests)
                for r in fitting:
                    sargs = search.parse_args(["--hardware", hw, "--num-requests", str(args.num_requests),
                                               "--time-model", TIME_MODEL,
                                               "--override", *SETTINGS[r["setting"]]])
                    row = search.search_stack(sargs, tp, spec, requests, native)
                    keep = {k: row.get(k) for k in ("max_rate_req_s", "fail_rate_req_s", "fails_on", "output_tok_s",
                                                    "output_tok_s_per_gpu", "ttft_p99_ms", "tpot_p99_ms",
                                                    "num_preemptions", "kv_utilization_max", "num_probes")}
                    capacity.append({"hardware": hw, "tp": tp, "setting": r["setting"], **keep})
                    print(f"{hw:10s} TP {tp} {r['setting']:24s} max {keep['max_rate_req_s'] or 0:6.2f} req/s "
                          f"({keep['output_tok_s_per_gpu'] or 0:.0f} out tok/s/GPU, fails on {keep['fails_on']})",
                          flush=True)
    result = {"model": "llama3_70b (Llama-3.1-70B shape, bfloat16)", "memory": memory, "capacity": capacity,
              "capacity_stack": "fcfs / chunked (2048) / recompute, max_num_seqs 256, max_model_len 16384",
              "slo": {"ttft_p99_ms": 2000.0, "tpot_p99_ms": 100.0}, "num_requests": args.num_requests,
              "clock": "virtual", "time_model": TIME_MODEL if capacity else None, "wall_s": round(time.perf_counter() - t0, 1),
              "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
    Path(args.out).write_text(json.dumps(result, indent=1, default=str) + "\n")
    print(f"wrote {args.out}")
    return result


if __name__ == "__main__":
    import logging

    logging.getLogger("servelab").setLevel(logging.WARNING)
    main(sys.argv[1:])
