"""Which engine preset (``engine=``, conf/engine/*.yaml) priced each published run, and the flags it ran with.

``preset(entry)`` maps a ``published.yaml`` entry (``engine.name``, ``engine.version``, ``engine.flags``)
to ``(preset name, overrides, flags not modelled)``, or ``None`` for an engine without a preset
(TensorRT-LLM, LMDeploy's TurboMind: their rows are scored under the default engine only):

- vLLM 0.4 - 0.7 -> ``engine=vllm_v0``; vLLM 0.8 and later -> ``engine=vllm_v1``;
- SGLang 0.4 and later -> ``engine=sglang``; SGLang 0.3 -> ``engine=sglang`` with that version's
  differences: no overlap scheduler (it became the default in 0.4: ``disable_overlap_schedule``) and
  0.3's CUDA-graph sizes (``CudaGraphRunner``: ``[1, 2, 4] + [i * 8 for i in range(1, 21)]``);
- each flag the run was started with, as the config key it sets (``FLAGS``); a flag with no
  counterpart in the simulator is listed (the page shows it), never guessed.
"""

from __future__ import annotations

import re

# (pattern in the published flags, override(s); "{n}" is the pattern's first group)
FLAGS = [
    (r"--num[-_]scheduler[-_]steps[ =](\d+)", ["num_scheduler_steps={n}"]),
    (r"--disable-radix-cache", ["allocator.prefix_caching=false"]),
    (r"--no-enable-prefix-caching", ["allocator.prefix_caching=false"]),
    (r"--enable-prefix-caching", ["allocator.prefix_caching=true"]),
    (r"--enforce-eager", ["sim.cuda_graphs=false"]),
    (r"--disable-cuda-graph\b", ["sim.cuda_graphs=false"]),
    (r"--disable-custom-all-reduce", ["sim.all_reduce=nccl"]),
    (r"--enable-mixed-chunk", ["chunked_prefill=true"]),
    (r"--async-scheduling", ["engine.overlap=true"]),
    (r"--disable-overlap-schedule", ["engine.overlap=false"]),
]
NOT_MODELLED = [r"--enable-torch-compile"]
SGLANG_030_GRAPH_SIZES = [1, 2, 4] + [8 * i for i in range(1, 21)]
# the conditions a preset decides (the schedule's shape); published.yaml's values are that engine's
# defaults written out for the default engine's column, so the preset column leaves them to the preset
PRESET_DECIDES = ("chunked_prefill", "max_num_batched_tokens")


def _version(entry: dict) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", str(entry["engine"]["version"]))[:3])


def preset(entry: dict) -> tuple[str, list[str], list[str]] | None:
    """``(preset, overrides, flags not modelled)`` for ``entry``'s engine, or None without a preset."""
    name, version, flags = entry["engine"]["name"], _version(entry), str(entry["engine"].get("flags") or "")
    overrides: list[str] = []
    if name == "vllm" and version >= (0, 8):
        chosen = "vllm_v1"
    elif name == "vllm" and version >= (0, 4):
        chosen = "vllm_v0"
    elif name == "sglang" and version >= (0, 4):
        chosen = "sglang"
    elif name == "sglang" and version >= (0, 3):
        chosen = "sglang"
        sizes = ",".join(str(s) for s in SGLANG_030_GRAPH_SIZES)
        overrides += ["engine.overlap=false", f"sim.cuda_graph_sizes=[{sizes}]"]
    else:
        return None
    for pattern, sets in FLAGS:
        m = re.search(pattern, flags)
        if m:
            overrides += [s.format(n=m.group(1)) if m.groups() else s for s in sets]
    missing = [p.replace("\\", "") for p in NOT_MODELLED if re.search(p, flags)]
    return chosen, [f"engine={chosen}", *overrides], missing
