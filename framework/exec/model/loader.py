"""Load an HF-format checkpoint directory (config.json + *.safetensors) into :class:`CausalLM`.

Each tensor-parallel rank reads only its shard of each tensor (safetensors slices), and HF's
separate q/k/v and gate/up projections are written into the fused parameters. A mixture-of-experts
layer's experts (``mlp.experts.<e>.*``; Mixtral's ``block_sparse_moe.experts.<e>.w1/w3/w2``) go to the
ranks that hold them (:func:`~servelab.exec.model.moe.expert_layout`), each as its shard.
"""

from __future__ import annotations

import re
from pathlib import Path

import torch
from safetensors import safe_open

from servelab.exec.model.layers import PipelineStage, TPGroup
from servelab.exec.model.llama import CausalLM, local_heads
from servelab.exec.model.moe import expert_layout
from servelab.core.model_spec import CheckpointError, ModelSpec, load_spec

_LAYER = re.compile(r"^layers\.(\d+)\.(.+)$")
_EXPERT = re.compile(r"^mlp\.experts\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")
_MIXTRAL = {"w1": "gate_proj", "w3": "up_proj", "w2": "down_proj"}


def load_model(path: str | Path, tp: TPGroup, dtype: torch.dtype, device: torch.device,
               max_positions: int, stage: PipelineStage | None = None) -> CausalLM:
    """Build the model for ``path`` and fill this rank's shard of every weight (of ``stage``'s layers)."""
    spec = load_spec(path)
    if spec.num_heads % tp.size:
        raise CheckpointError(f"tensor_parallel_size={tp.size} does not divide num_attention_heads={spec.num_heads}")
    files = sorted(Path(path).glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"model.path={str(path)!r}: no *.safetensors weight files in the directory")
    with torch.device(device):  # parameters are torch.empty: no init work
        model = CausalLM(spec, tp, max_positions, stage)
    params = dict(model.named_parameters())
    filled: set[tuple[str, int | None]] = set()
    for file in files:
        with safe_open(str(file), framework="pt") as st:
            for name in st.keys():
                for target, rows, load in _route(name, spec, tp):
                    if target not in params:
                        continue
                    tensor = load(st.get_slice(name)).to(dtype)
                    dest = params[target].data
                    if rows is None:
                        dest.copy_(tensor)
                    else:
                        dest[rows[0]:rows[0] + tensor.shape[0]].copy_(tensor)
                    filled.add((target, None if rows is None else rows[0]))
    _check_complete(model, params, filled, spec, tp, path)
    for param in params.values():
        param.data = param.data.to(dtype)  # buffers (the RoPE table) stay float32
    return model.eval()


def _route(name: str, spec: ModelSpec, tp: TPGroup):
    """Yield ``(our_param, (row_offset,) or None, slice_loader)`` for one checkpoint tensor."""
    name = name.removeprefix("model.")
    if name.endswith("rotary_emb.inv_freq"):
        return
    if name in ("embed_tokens.weight", "lm_head.weight"):
        if name == "lm_head.weight" and spec.tie_word_embeddings:
            return
        shard = -(-spec.vocab_size // tp.size)
        start = tp.rank * shard
        yield name, (0,), lambda s: s[start:min(start + shard, spec.vocab_size)]
        if name == "embed_tokens.weight" and spec.tie_word_embeddings:  # a last pipeline stage's own copy
            yield "lm_head.weight", (0,), lambda s: s[start:min(start + shard, spec.vocab_size)]
        return
    match = _LAYER.match(name)
    if not match:
        yield name, None, lambda s: s[:]
        return
    prefix, leaf = f"layers.{match.group(1)}.", _moe_name(match.group(2))
    expert = _EXPERT.match(leaf)
    if expert:
        yield from _route_expert(prefix, int(expert.group(1)), expert.group(2), spec, tp)
        return
    heads, kv_heads = local_heads(spec, tp)
    hd = spec.head_dim
    kv_start = (tp.rank * spec.num_kv_heads) // tp.size if tp.size <= spec.num_kv_heads else \
        tp.rank // (tp.size // spec.num_kv_heads)
    proj, _, kind = leaf.rpartition(".")  # e.g. ("self_attn.q_proj", "weight")
    q_rows = (tp.rank * heads * hd, heads * hd)
    kv_rows = (kv_start * hd, kv_heads * hd)
    inter = spec.intermediate_size // tp.size
    fused = {
        "self_attn.q_proj": ("self_attn.qkv_proj", 0, q_rows),
        "self_attn.k_proj": ("self_attn.qkv_proj", heads * hd, kv_rows),
        "self_attn.v_proj": ("self_attn.qkv_proj", (heads + kv_heads) * hd, kv_rows),
        "mlp.gate_proj": ("mlp.gate_up_proj", 0, (tp.rank * inter, inter)),
        "mlp.up_proj": ("mlp.gate_up_proj", inter, (tp.rank * inter, inter)),
    }
    if proj in fused:
        target, offset, (start, length) = fused[proj]
        yield f"{prefix}{target}.{kind}", (offset,), lambda s: s[start:start + length]
    elif proj in ("self_attn.o_proj", "mlp.down_proj"):
        width = heads * hd if proj == "self_attn.o_proj" else inter
        start = tp.rank * width
        yield f"{prefix}{leaf}", None, lambda s: s[:, start:start + width]
    else:  # norms: replicated
        yield f"{prefix}{leaf}", None, lambda s: s[:]


def _moe_name(leaf: str) -> str:
    """Mixtral's names as Qwen3-MoE's: ``block_sparse_moe.`` is ``mlp.``, w1/w3/w2 are gate/up/down."""
    if not leaf.startswith("block_sparse_moe."):
        return leaf
    leaf = "mlp." + leaf.removeprefix("block_sparse_moe.")
    parts = leaf.split(".")
    if len(parts) == 5 and parts[1] == "experts":
        parts[3] = _MIXTRAL.get(parts[3], parts[3])
    return ".".join(parts)


def _route_expert(prefix: str, expert: int, proj: str, spec: ModelSpec, tp: TPGroup):
    """Expert ``expert``'s ``proj`` if this rank holds it: its shard of the intermediate features."""
    first, local, shard, inner_rank = expert_layout(spec, tp)
    if not first <= expert < first + local:
        return
    target = f"{prefix}mlp.experts.{expert - first}."
    start = inner_rank * shard
    if proj == "down_proj":
        yield f"{target}down_proj.weight", None, lambda s: s[:, start:start + shard]
    else:
        yield f"{target}gate_up_proj.weight", (0 if proj == "gate_proj" else shard,), \
            lambda s: s[start:start + shard]


def _check_complete(model, params, filled, spec, tp, path) -> None:
    pieces: dict[str, int] = {}
    for target, _ in filled:
        pieces[target] = pieces.get(target, 0) + 1
    expected = {"qkv_proj": 3, "gate_up_proj": 2}
    missing = [name for name in params
               if pieces.get(name, 0) < expected.get(name.rsplit(".", 2)[-2], 1)]
    if "lm_head.weight" in missing and not spec.tie_word_embeddings:
        missing = [m for m in missing if m != "lm_head.weight"] + ["lm_head.weight (untied LM head)"]
    if missing:
        shown = ", ".join(missing[:8]) + (f" and {len(missing) - 8} more" if len(missing) > 8 else "")
        raise CheckpointError(f"{path}: checkpoint is missing weights for {shown}")
    vocab_shard = -(-spec.vocab_size // tp.size)
    if tp.rank * vocab_shard + vocab_shard > spec.vocab_size:  # zero the padding rows of the last shard
        valid = max(0, spec.vocab_size - tp.rank * vocab_shard)
        for table in (model.embed_tokens, model.lm_head):
            if table is not None and getattr(table, "weight", None) is not None:
                table.weight.data[valid:].zero_()
