"""Which of the simulator's engine timing features each published run's engine used, as config overrides.

``columns(entry)`` maps a ``published.yaml`` entry (its ``engine.name``, ``engine.version``,
``engine.flags``, ``tp`` and conditions) to one override list per feature column, or ``None`` where
the feature does not apply to that engine as it ran (the page prints "n/a"):

- ``multi_step``: vLLM's ``--num-scheduler-steps N`` (N > 1) -> ``num_scheduler_steps=N``;
- ``cuda_graphs``: vLLM (>= 0.2, unless ``--enforce-eager``) and SGLang (unless ``--disable-cuda-graph``)
  capture decode graphs -> ``sim.cuda_graphs=true`` with the engine's captured batch sizes;
- ``custom_all_reduce``: vLLM (>= 0.4) and SGLang (which calls vLLM's kernel) at TP > 1, unless
  ``--disable-custom-all-reduce`` -> ``sim.all_reduce=auto`` (custom one-shot below 8 MiB at TP 2/4/6/8);
- ``frontend``: vLLM's OpenAI server detokenises in the engine's process -> ``frontend=vllm_030_detokenize``;
- ``prefill_first``: engines that run waiting prompts whole in prompt-only steps (vLLM v0 without
  chunked prefill, SGLang without a mixed chunk, a static batch) -> ``non_chunked_schedule=prefill_first``.

``base`` is the simulator as the earlier e2e figures ran it: the source's limits, every feature off
and ``non_chunked_schedule=decode_first`` (the schedule before ``prefill_first`` became the default),
so that each column is base plus one feature. ``all`` is base plus every applicable feature.
Engines without a rule (TensorRT-LLM's static batch runner, LMDeploy's TurboMind) get "n/a" for the
feature they did not run, never a guess.
"""

from __future__ import annotations

import re

FEATURES = ("multi_step", "cuda_graphs", "custom_all_reduce", "frontend", "prefill_first")
COLUMNS = ("base", *FEATURES, "all")
BASE = ["non_chunked_schedule=decode_first"]

# SGLang v0.3's CudaGraphRunner: capture_bs = [1, 2, 4] + [i * 8 for i in range(1, 21)]
# (sgl-project/sglang python/sglang/srt/model_executor/cuda_graph_runner.py)
SGLANG_CUDA_GRAPH_SIZES = [1, 2, 4] + [8 * i for i in range(1, 21)]
CUSTOM_ALL_REDUCE_TP = (2, 4, 6, 8)


def _version(entry: dict) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", str(entry["engine"]["version"]))[:3])


def _flags(entry: dict) -> str:
    return str(entry["engine"].get("flags") or "")


def _num_scheduler_steps(flags: str) -> int:
    m = re.search(r"--num[-_]scheduler[-_]steps[ =](\d+)", flags)
    return int(m.group(1)) if m else 1


def feature_overrides(entry: dict) -> dict[str, list[str] | None]:
    """Each feature's overrides for ``entry`` as its engine ran, or None where it does not apply."""
    name, version, flags = entry["engine"]["name"], _version(entry), _flags(entry)
    c = entry["conditions"]
    out: dict[str, list[str] | None] = dict.fromkeys(FEATURES)
    if name == "vllm":
        steps = _num_scheduler_steps(flags)
        if steps > 1:
            out["multi_step"] = [f"num_scheduler_steps={steps}"]
        if version >= (0, 2) and "--enforce-eager" not in flags:
            out["cuda_graphs"] = ["sim.cuda_graphs=true"]  # vLLM's sizes are the simulator's default
        if version >= (0, 4) and entry["tp"] in CUSTOM_ALL_REDUCE_TP and "--disable-custom-all-reduce" not in flags:
            out["custom_all_reduce"] = ["sim.all_reduce=auto"]
        out["frontend"] = ["frontend=vllm_030_detokenize"]
        if not c["chunked_prefill"] and version < (0, 7):  # vLLM v0's _schedule_default
            out["prefill_first"] = ["non_chunked_schedule=prefill_first"]
    elif name == "sglang":
        if "--disable-cuda-graph" not in flags:
            sizes = ",".join(str(s) for s in SGLANG_CUDA_GRAPH_SIZES)
            out["cuda_graphs"] = ["sim.cuda_graphs=true", f"sim.cuda_graph_sizes=[{sizes}]"]
        if entry["tp"] in CUSTOM_ALL_REDUCE_TP and "--disable-custom-all-reduce" not in flags:
            out["custom_all_reduce"] = ["sim.all_reduce=auto"]
        if "--enable-mixed-chunk" not in flags:
            # prompts (<= the 8192-token chunk here, so never split) in prefill-only batches ahead of decodes
            out["prefill_first"] = ["chunked_prefill=false", "non_chunked_schedule=prefill_first"]
    elif name == "tensorrt_llm" and entry.get("runner") == "static_batch":
        out["prefill_first"] = ["non_chunked_schedule=prefill_first"]  # a static batch: all context, then decode
    return out


def columns(entry: dict, wanted: tuple[str, ...] = COLUMNS) -> dict[str, list[str] | None]:
    """Override lists per column in ``wanted`` (base first), None for a column that does not apply.

    ``all`` is None when no feature applies (it would repeat base)."""
    feats = feature_overrides(entry)
    out: dict[str, list[str] | None] = {}
    for col in wanted:
        if col == "base":
            out[col] = list(BASE)
        elif col == "all":
            on = [o for f in FEATURES if feats[f] for o in feats[f]]
            out[col] = _merge(BASE + on) if on else None
        elif col in feats:
            out[col] = None if feats[col] is None else _merge(BASE + feats[col])
        else:
            raise ValueError(f"unknown column {col!r}: one of {', '.join(COLUMNS)}")
    return out


def _merge(overrides: list[str]) -> list[str]:
    """Later ``key=value`` wins over an earlier one for the same key (order kept by first appearance)."""
    merged: dict[str, str] = {}
    for o in overrides:
        key = o.split("=", 1)[0]
        merged[key] = o
    return list(merged.values())


def flags_used(entry: dict) -> dict[str, str]:
    """A short "what the engine ran" per feature, for the page's flags table."""
    feats = feature_overrides(entry)
    return {f: ("n/a" if v is None else " ".join(o for o in v if o not in BASE)) for f, v in feats.items()}
