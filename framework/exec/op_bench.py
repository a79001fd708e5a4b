"""Time the operators of one decoder layer, the paged attention kernels and the all-reduce on this machine.

The measuring half of ``servelab profile-ops`` (the command, its options and the tables it writes:
:mod:`servelab.cli.profile_ops`, docs/op-tables.md). Everything timed is servelab's own code:

- one :class:`~servelab.exec.model.llama.DecoderLayer` of the model's shape at a tensor-parallel
  degree, built as rank 0 of that degree builds it (column-parallel ``qkv`` / ``gate_up`` with
  ``n / tp`` output features, row-parallel ``o`` / ``down`` with ``k / tp`` input features, the
  all-reduce left out), random weights in the run's dtype, ``model.quantization=int8`` through
  :func:`servelab.exec.quant.quantize_model` (the INT8 kernel a run would pick);
- the paged-cache operations of :mod:`servelab.kernels` (``store_kv``, ``paged_attention``) for the
  torch and Triton backends over a :class:`~servelab.exec.kv_pool.KVPool`;
- ``torch.distributed.all_reduce`` across ``tp`` processes (NCCL on CUDA, gloo on CPU).

Each point is the **median** of ``repeats`` calls after ``warmup`` untimed ones: CUDA events around
each call (queued back to back, one synchronize at the end: a kernel shorter than its launch is
timed as the launch-bound cost servelab's eager engine pays), ``time.perf_counter`` on CPU.
"""

from __future__ import annotations

import math
import os
import tempfile
import time
import traceback
from dataclasses import dataclass
from statistics import median
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from servelab.core.model_spec import ModelSpec
from servelab.exec.kv_pool import KVPool
from servelab.exec.model.layers import Rotary, TPGroup, VocabParallelEmbedding
from servelab.exec.model.llama import DecoderLayer, rope_frequencies
from servelab.exec.quant import quantize_model

# The ops.csv columns, in file order (docs/op-tables.md): the embedding, then one decoder layer.
OP_COLUMNS = ("emb", "input_norm", "qkv", "rope", "o", "post_norm", "gate_up", "act", "down", "add")


def token_grid(max_tokens: int) -> list[int]:
    """1, 2, 3, 4, 6, 8, 12, 16, ... (2^k and 3 * 2^k) up to ``max_tokens``, which is always the last."""
    if max_tokens < 1:
        raise ValueError(f"max_tokens={max_tokens} must be >= 1")
    grid = {1}
    k = 1
    while k <= max_tokens:
        grid.update(v for v in (k, 3 * k // 2) if v <= max_tokens)
        k *= 2
    grid.add(max_tokens)
    return sorted(grid)


def byte_grid(min_bytes: int, max_bytes: int) -> list[int]:
    """Message sizes: 2^k and 3 * 2^(k-1) bytes from ``min_bytes`` to ``max_bytes`` (the last)."""
    return [b for b in token_grid(max_bytes) if b >= min_bytes] or [max_bytes]


def median_seconds(fn: Callable[[], object], repeats: int, warmup: int, device: torch.device) -> float:
    """The median wall time of ``fn()`` in seconds over ``repeats`` calls, after ``warmup`` calls."""
    with torch.inference_mode():
        for _ in range(warmup):
            fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            marks = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                     for _ in range(repeats)]
            for start, end in marks:
                start.record()
                fn()
                end.record()
            torch.cuda.synchronize(device)
            return median(s.elapsed_time(e) for s, e in marks) / 1e3
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        return median(times)


def bench_group(tp: int) -> TPGroup:
    """Rank 0 of a ``tp``-way group whose collectives cost nothing: the row-parallel layers' partial
    sums are not all-reduced (the all-reduce is timed on its own), and an all-gather repeats this
    rank's part (what INT8 quantisation of a row-parallel shard asks for: a row's scale)."""
    return TPGroup(0, tp, lambda t: t, lambda t: torch.cat([t] * tp, dim=-1) if tp > 1 else t)


@dataclass
class BenchLayer:
    """One decoder layer's rank-0 shard and the embedding's, on ``device`` in ``dtype``."""

    spec: ModelSpec
    tp: int
    layer: DecoderLayer
    embedding: VocabParallelEmbedding
    dtype: torch.dtype
    device: torch.device
    int8_kernel: str | None

    @property
    def heads(self) -> tuple[int, int]:
        """(query heads, KV heads) of this rank."""
        return self.layer.self_attn.num_heads, self.layer.self_attn.num_kv_heads


def build_layer(spec: ModelSpec, tp: int, dtype: torch.dtype, device: torch.device, max_positions: int,
                quantization: str = "none", int8_kernel: str | None = None, seed: int = 0) -> BenchLayer:
    """Rank 0's shard of one decoder layer (and of the embedding) at TP degree ``tp``, random weights
    (std 0.02; norms 1) in ``dtype``; the RoPE table stays float32, as the loader leaves it.
    ``quantization="int8"`` quantises its four linears with ``int8_kernel`` as a run would."""
    group = bench_group(tp)
    inv_freq, scaling = rope_frequencies(spec)
    rotary = Rotary(inv_freq, scaling, max_positions).to(device)
    torch.manual_seed(seed)
    with torch.device(device):
        layer = DecoderLayer(spec, group, rotary, 0)
        embedding = VocabParallelEmbedding(spec.vocab_size, spec.hidden_size, group)
    with torch.no_grad():
        for module in (layer, embedding):
            for name, param in module.named_parameters():
                value = torch.empty(param.shape, dtype=dtype, device=device)
                if "norm" in name:
                    value.fill_(1.0)
                else:
                    value.normal_(0.0, 0.02)
                param.data = value
    if quantization != "none":
        holder = nn.Module()
        holder.layers = nn.ModuleList([layer])  # quantize_model quantises the linears under "layers."
        quantize_model(holder, quantization, int8_kernel or "dequant", collective_device=device)
    return BenchLayer(spec, tp, layer.eval(), embedding.eval(), dtype, device,
                      int8_kernel if quantization != "none" else None)


def layer_op_calls(bench: BenchLayer, tokens: int, seed: int = 0) -> dict[str, Callable[[], object]]:
    """For a step of ``tokens`` tokens, one call per :data:`OP_COLUMNS` entry, each running exactly
    what :class:`DecoderLayer` runs for that operator on inputs of the shape it sees there."""
    spec, dev, dtype = bench.spec, bench.device, bench.dtype
    attn, mlp = bench.layer.self_attn, bench.layer.mlp
    gen = torch.Generator(device=dev).manual_seed(seed)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, device=dev, dtype=torch.float32).to(dtype)

    x, residual = rand(tokens, spec.hidden_size), rand(tokens, spec.hidden_size)
    positions = torch.arange(tokens, device=dev)
    ids = torch.randint(0, spec.vocab_size, (tokens,), generator=gen, device=dev)
    with torch.inference_mode():
        qkv = attn.qkv_proj(x)
    q, k, _ = qkv.split([attn.q_size, attn.kv_size, attn.kv_size], dim=-1)
    q = q.view(tokens, attn.num_heads, attn.head_dim)  # views of the fused output, as in Attention.forward
    k = k.view(tokens, attn.num_kv_heads, attn.head_dim)
    attn_out = rand(tokens, attn.q_size)
    gate_up = rand(tokens, 2 * mlp.shard)
    hidden = rand(tokens, mlp.shard)

    def rope():
        qq, kk = (attn.q_norm(q), attn.k_norm(k)) if attn.q_norm is not None else (q, k)  # Qwen3's QK norm
        return attn.rotary(positions, qq, kk)

    def act():
        gate, up = gate_up.split(mlp.shard, dim=-1)
        return F.silu(gate) * up  # MLP.forward's activation

    return {
        "emb": lambda: bench.embedding(ids),
        "input_norm": lambda: bench.layer.input_layernorm(x),
        "qkv": lambda: attn.qkv_proj(x),
        "rope": rope,
        "o": lambda: attn.o_proj(attn_out),
        "post_norm": lambda: bench.layer.post_attention_layernorm(x),
        "gate_up": lambda: mlp.gate_up_proj(x),
        "act": act,
        "down": lambda: mlp.down_proj(hidden),
        "add": lambda: x + residual,
    }


def time_layer_ops(bench: BenchLayer, tokens: list[int], repeats: int, warmup: int,
                   progress: Callable[[str], None] | None = None) -> dict[str, list[float]]:
    """``{op: [median seconds at each token count]}`` for every :data:`OP_COLUMNS` entry."""
    out: dict[str, list[float]] = {op: [] for op in OP_COLUMNS}
    for n in tokens:
        calls = layer_op_calls(bench, n)
        for op in OP_COLUMNS:
            out[op].append(median_seconds(calls[op], repeats, warmup, bench.device))
        if progress is not None:
            progress(f"tp={bench.tp} tokens={n}")
        del calls
    return out


@dataclass(frozen=True)
class AttentionPoint:
    """One attention measurement: ``batch_size`` sequences of ``query_len`` new tokens each, every
    sequence ``context_len`` tokens long after the step (cached + new); seconds."""

    phase: str  # "prefill" | "decode"
    batch_size: int
    query_len: int
    context_len: int
    store_kv: float
    attention: float


def attention_grid(prefill_tokens: list[int], decode_batches: list[int], contexts: list[int],
                   max_kv_tokens: int) -> list[tuple[str, int, int, int]]:
    """``(phase, batch, query_len, context_len)`` points: a prefill of ``q`` new tokens (one sequence)
    at each context ``c >= q`` and at ``c = q`` (no cached prefix); a decode of ``b`` sequences at each
    context. Points holding more than ``max_kv_tokens`` tokens of KV are left out."""
    points = []
    for q in sorted(set(prefill_tokens)):
        for c in sorted({q, *(c for c in contexts if c >= q)}):
            if c <= max_kv_tokens:
                points.append(("prefill", 1, q, c))
    for b in sorted(set(decode_batches)):
        for c in sorted(set(contexts)):
            if b * c <= max_kv_tokens:
                points.append(("decode", b, 1, c))
    return points


def time_attention_point(ops, bench: BenchLayer, phase: str, batch: int, query_len: int, context_len: int,
                         block_size: int, kv_dtype: torch.dtype, kv_quantized: bool, repeats: int,
                         warmup: int, seed: int = 0) -> AttentionPoint:
    """``ops.store_kv`` of the step's new K/V and ``ops.paged_attention`` over the paged cache (this
    rank's heads), each sequence's blocks contiguous in a one-layer :class:`KVPool`."""
    dev, dtype = bench.device, bench.dtype
    heads, kv_heads = bench.heads
    head_dim = bench.spec.head_dim
    blocks = -(-context_len // block_size)
    pool = KVPool(1, batch * blocks, block_size, kv_heads, head_dim, kv_dtype, kv_quantized, dev)
    k_cache, v_cache, *scales = pool.layers()[0]
    quant = dict(zip(("k_scale", "v_scale"), scales))
    tables = torch.arange(batch * blocks, dtype=torch.int32, device=dev).view(batch, blocks)
    pos = torch.arange(context_len - query_len, context_len, device=dev)
    slots = (tables[:, pos // block_size].long() * block_size + pos % block_size).reshape(-1)
    cu = torch.arange(batch + 1, dtype=torch.int32, device=dev) * query_len
    ctx = torch.full((batch,), context_len, dtype=torch.int32, device=dev)
    gen = torch.Generator(device=dev).manual_seed(seed)
    num = batch * query_len

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, device=dev, dtype=torch.float32).to(dtype)

    q, k, v = rand(num, heads, head_dim), rand(num, kv_heads, head_dim), rand(num, kv_heads, head_dim)
    scale = head_dim ** -0.5

    def store():
        ops.store_kv(k, v, k_cache, v_cache, slots, **quant)

    def attend():
        return ops.paged_attention(q, k_cache, v_cache, tables, cu, ctx, query_len, context_len, scale, **quant)

    store_s = median_seconds(store, repeats, warmup, dev)
    attend_s = median_seconds(attend, repeats, warmup, dev)
    del pool
    return AttentionPoint(phase, batch, query_len, context_len, store_s, attend_s)


# ---- all-reduce ---------------------------------------------------------------------------------

def all_reduce_ranks_here(cuda: bool) -> int:
    """How many ranks an all-reduce can have on this machine: one per CUDA device (NCCL), else one
    per CPU core this process may use (gloo)."""
    if cuda:
        return torch.cuda.device_count()
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def time_all_reduce(tp: int, sizes: list[int], dtype: torch.dtype, cuda: bool, repeats: int, warmup: int,
                    timeout_s: float = 600.0) -> list[float]:
    """Median seconds of one ``all_reduce`` of each size in ``sizes`` (bytes each rank holds) across
    ``tp`` spawned processes (NCCL, one GPU each, on CUDA; gloo on CPU), as rank 0 sees it. Raises
    RuntimeError naming the failing rank."""
    import torch.multiprocessing as mp  # noqa: PLC0415 - only when an all-reduce is measured

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    with tempfile.TemporaryDirectory(prefix="servelab-allreduce-") as tmp:
        init = f"file://{tmp}/store"
        dtype_name = str(dtype).removeprefix("torch.")
        procs = [ctx.Process(target=_all_reduce_rank, name=f"servelab-allreduce-rank{rank}", daemon=True,
                             args=(rank, tp, init, sizes, dtype_name, cuda, repeats, warmup, queue))
                 for rank in range(tp)]
        for p in procs:
            p.start()
        try:
            deadline = time.monotonic() + timeout_s
            result = None
            while result is None:
                try:
                    result = queue.get(timeout=1.0)
                except Exception:  # noqa: BLE001 - queue.Empty: check the ranks are still alive
                    dead = [p for p in procs if p.exitcode not in (None, 0)]
                    if dead:
                        raise RuntimeError(f"all-reduce rank {procs.index(dead[0])} exited with code "
                                           f"{dead[0].exitcode}") from None
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"all-reduce at tp={tp} did not finish in {timeout_s:.0f} s") from None
            ok, payload = result
            if not ok:
                raise RuntimeError(payload)
            return payload
        finally:
            for p in procs:
                p.join(timeout=30)
                if p.is_alive():
                    p.kill()
                    p.join()


def _all_reduce_rank(rank: int, size: int, init: str, sizes: list[int], dtype_name: str, cuda: bool,
                     repeats: int, warmup: int, queue) -> None:
    import torch.distributed as dist  # noqa: PLC0415

    try:
        torch.set_num_threads(1)
        device = torch.device("cuda", rank) if cuda else torch.device("cpu")
        if cuda:
            torch.cuda.set_device(device)
        dist.init_process_group("nccl" if cuda else "gloo", init_method=init, rank=rank, world_size=size)

        def barrier() -> None:
            dist.barrier(device_ids=[rank]) if cuda else dist.barrier()

        dtype = getattr(torch, dtype_name)
        itemsize = torch.tensor([], dtype=dtype).element_size()
        medians = []
        for nbytes in sizes:
            t = torch.ones(max(1, nbytes // itemsize), dtype=dtype, device=device)
            for _ in range(warmup):
                dist.all_reduce(t)
            times = []
            for _ in range(repeats):
                barrier()
                if cuda:
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    start.record()
                    dist.all_reduce(t)
                    end.record()
                    end.synchronize()
                    times.append(start.elapsed_time(end) / 1e3)
                else:
                    begin = time.perf_counter()
                    dist.all_reduce(t)
                    times.append(time.perf_counter() - begin)
            medians.append(median(times))
        barrier()
        if rank == 0:
            queue.put((True, medians))
        dist.destroy_process_group()
    except BaseException:  # noqa: BLE001 - the parent reports it as one line
        queue.put((False, f"all-reduce rank {rank}: {traceback.format_exc().strip().splitlines()[-1]}"))


def round_sig(value: float, digits: int = 4) -> float:
    """``value`` to ``digits`` significant digits (0 stays 0)."""
    if value == 0 or not math.isfinite(value):
        return value
    return round(value, digits - 1 - int(math.floor(math.log10(abs(value)))))
