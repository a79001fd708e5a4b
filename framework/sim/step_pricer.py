"""Price a whole engine step from per-operator times: the part ``time_model=op_profile`` and
``time_model=calibrated_roofline`` share.

A step on one rank of ``tp`` (all ranks work in parallel) costs

    layers x layer(tokens)                  decoder linears + token-wise kernels (a curve over tokens)
  + layers x attention(flops, bytes)        attention kernels (the calibrated roofline: no public table)
  + 2 x layers x all_reduce(tokens x hidden x act bytes)      tensor parallel (Megatron: 2 per layer)
  + lm_head(sampled rows)                   final norm + LM head GEMM for the rows that sample
  + host(sequences)                         scheduling, input preparation, sampling, output processing
  + swap and copy traffic                   the host link and HBM

A mixture-of-experts model's MoE layers are priced apart: their dense part (attention projections,
router, shared experts, token-wise kernels) in the layer curve, their routed experts and expert
parallelism's all-to-all per step from the experts the step's tokens touch
(:mod:`servelab.sim.moe_pricer`; measured op tables have no MoE entries, so the experts are always
priced by the calibrated roofline's GEMM formula). A dense model's steps are priced as before.

An engine preset (``context.engine_host``, :class:`servelab.core.engine_host.EngineHost`) changes the
host term: its own per-step, per-sequence and per-scheduled-token seconds in place of the time
model's, and with ``overlap`` the step takes ``max(gpu, host)`` instead of ``gpu + host`` (the host
prepares the next step while the GPU runs this one). Without a preset, or with one that keeps the
time model's host and does not overlap, a step is priced exactly as before.

The engine's timing features (``sim.*`` in the context) change two terms. With CUDA graphs
(``context.cuda_graph_sizes``) a decode-only step of B sequences runs the captured graph of the
next size >= B: its layers and all-reduces are priced at that padded token count (attention, the
LM head's sampled rows and the host at the real B); above the largest size, and for any step with
a prompt chunk or drafts, the step runs eagerly. ``context.all_reduce`` picks the all-reduce's
price (:mod:`servelab.sim.all_reduce`).

Every term that depends on one count is looked up in a table of its value at every integer count
(built once, extended by doubling when a step is larger), so a simulated step costs a few list
lookups and one attention expression: the simulator's speed does not depend on the time model.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from servelab.core.contexts import TimeModelContext
from servelab.core.step_work import StepWork
from servelab.sim.all_reduce import choose_all_reduce
from servelab.sim.dp_attention import slowest_rank_work
from servelab.sim.gpu_ops import GpuOps
from servelab.sim.moe_pricer import MoePricer, gpu_ops_moe
from servelab.sim.pipeline import PipelineBooks, split_work, stage_layout

ArrayFn = Callable[[np.ndarray], np.ndarray]


class _Dense:
    """``fn`` at every integer 0..n as a Python list (fast scalar indexing), grown on demand."""

    def __init__(self, fn: ArrayFn, n: int = 4096) -> None:
        self.fn = fn
        self.values: list[float] = []
        self._grow(n)

    def _grow(self, n: int) -> None:
        self.values = [float(v) for v in self.fn(np.arange(n + 1, dtype=float))]
        self.values[0] = 0.0

    def __getitem__(self, i: int) -> float:
        if i >= len(self.values):
            self._grow(max(2 * len(self.values), i + 1))
        return self.values[i]


class StepPricer:
    """Seconds of one step from per-count terms (each a function of a numpy array of counts)."""

    def __init__(self, context: TimeModelContext, ops: GpuOps, *, layer: ArrayFn, allreduce: ArrayFn | None,
                 host: ArrayFn, act_bytes: float = 2.0, allreduces_per_layer: int = 2) -> None:
        s, tp = context.shape, context.tensor_parallel_size
        self.num_layers = s.num_layers
        self.moe: MoePricer | None = None
        allreduces = allreduces_per_layer * s.num_layers
        # data_parallel_attention: every layer but the routed experts runs on one rank's own sequences
        # with whole weights (servelab.sim.dp_attention); the MoE combine returns the layer's output
        self.dp_ranks = tp if context.data_parallel_attention else 1
        attn_tp = context.attention_tp
        if self.dp_ranks > 1:
            dense_weight = context.linear_weight_bytes or context.weight_dtype_bytes
            layer = lambda m: ops.layer(m, s, 1, act_bytes, dense_weight)  # noqa: E731 - the replicated layer
            allreduce = None
        if s.is_moe:  # MoE layers: their dense part here, the experts a step touches per step (moe_pricer)
            self.moe, moe_dense = gpu_ops_moe(context, ops, act_bytes,
                                              context.linear_weight_bytes or context.weight_dtype_bytes)
            self.moe.dp_attention = self.dp_ranks > 1
            self.moe.dp_weight_bytes_per_rank = context.weight_bytes_per_rank
            moe_layers = s.num_moe_layers
            self._layers = _Dense(lambda m: (s.num_layers - moe_layers) * layer(m) + moe_layers * moe_dense(m))
            if self.moe.all_to_all is not None:  # the combine returns a MoE layer's output, not an all-reduce
                allreduces -= moe_layers
        else:
            self._layers = _Dense(lambda m: s.num_layers * layer(m))
        hidden_bytes = s.hidden_size * act_bytes
        self.all_reduce_impl = "none (tp 1)" if tp <= 1 else "nccl"
        if allreduce is not None and tp > 1:
            allreduce, self.all_reduce_impl = choose_all_reduce(context, allreduce)
        self._allreduce = (_Dense(lambda m: allreduces * allreduce(m * hidden_bytes))
                           if allreduce is not None and tp > 1 else None)
        self._graph_size = graph_sizes(context.cuda_graph_sizes)
        self.graph_steps = 0  # decode steps priced as a captured CUDA graph, and the tokens they padded
        self.graph_padding_tokens = 0
        self.graph_tokens = 0
        self.engine_host = context.engine_host if context.engine_host is not None and \
            context.engine_host.changes_pricing else None
        if self.engine_host is not None:
            self.predict = self._predict_engine  # type: ignore[method-assign]  # the default path stays as it was
        elif self._graph_size:
            self.predict = self._predict_with_graphs  # type: ignore[method-assign]  # the default path stays as it was
        # the final norm and the LM head (column-parallel over the vocabulary) for the sampled rows
        self._lm_head = _Dense(lambda m: ops.tokenwise(m, 2 * s.hidden_size * act_bytes, "input_norm")
                               + ops.gemm(m, s.hidden_size, s.vocab_size / attn_tp, act_bytes,
                                          context.weight_dtype_bytes),
                               n=1024)
        self._host = _Dense(host, n=1024)
        self._ops = ops
        self._attn_flops_per_attended = 4 * (s.num_heads / attn_tp) * s.head_dim  # QK^T and PV, one layer
        self._kv_per_token = context.kv_bytes_per_token / s.num_layers  # one layer's K and V on this rank
        self._qo_per_token = 2 * (s.q_dim / attn_tp) * act_bytes
        self._host_link = context.hardware.host_link_gb_s * 1e9
        self._hbm = context.hardware.hbm_bandwidth_gb_s * 1e9 * ops.cal.bw_eff
        self._block = context.bytes_per_block
        self.dp_steps = 0  # data_parallel_attention: steps priced, and the slowest rank's tokens x ranks / tokens
        self.dp_imbalance_sum = 0.0
        if self.dp_ranks > 1:
            self.predict = self._predict_dp_attention  # type: ignore[method-assign]  # the default path stays as it was
        elif self.moe is not None and self.engine_host is None:  # the step's own experts (_predict_engine adds its own)
            base, experts = self.predict, self.moe.seconds
            self.predict = lambda work: base(work) + experts(work.num_tokens)  # type: ignore[method-assign]
        self.pipeline: PipelineBooks | None = None
        self._stage_curves: list[_Dense] = []
        if context.pipeline_parallel_size > 1:  # stages and batches in flight (servelab.sim.pipeline)
            pp = context.pipeline_parallel_size
            self.pipeline = PipelineBooks(stage_layout(s, context.hardware, tp, pp, context.gpus_per_node, act_bytes))
            if s.is_moe:  # each stage's own dense and MoE layers (DeepSeek's dense layers all sit on the first)
                for r in s.stage_layers(pp):
                    self._stage_curves.append(_Dense(_stage_curve(layer, moe_dense, len(r), sum(map(s.is_moe_layer, r)))))
            self.predict = self._predict_pipeline  # type: ignore[method-assign]  # the default path stays as it was

    def draft_pricer(self, context: TimeModelContext, layer: ArrayFn | None = None) -> "DraftPricer":
        """Prices drafting for this step pricer's world (see :class:`DraftPricer`)."""
        return DraftPricer(context, self._ops, self._host, layer=layer)

    def dense_tokens(self, work) -> int:
        """The tokens the step's layers and all-reduces run at: the captured graph's batch size for a
        decode-only step that fits one (CUDA graphs on), else the step's own token count."""
        n = work.num_tokens
        if n == work.decode_seqs and n < len(self._graph_size):
            return self._graph_size[n]
        return n

    def timing_summary(self) -> dict:
        """The engine timing features' figures for ``summary.json`` (empty with the defaults)."""
        out: dict = {}
        if self._graph_size:
            padded = self.graph_tokens + self.graph_padding_tokens
            out.update(cuda_graph_steps=self.graph_steps, cuda_graph_tokens=self.graph_tokens,
                       cuda_graph_padding_tokens=self.graph_padding_tokens,
                       cuda_graph_padding_share=self.graph_padding_tokens / padded if padded else 0.0)
        if self.all_reduce_impl not in ("nccl", "none (tp 1)"):
            out["all_reduce_impl"] = self.all_reduce_impl
        if self.moe is not None:
            out.update(self.moe.summary())
        if self.pipeline is not None:
            out.update(self.pipeline.summary())
        if self.dp_ranks > 1:
            out.update(dp_attention_ranks=self.dp_ranks, dp_attention_priced_steps=self.dp_steps,
                       dp_attention_mean_rank_imbalance=self.dp_imbalance_sum / self.dp_steps if self.dp_steps else 0.0)
        return out

    def host_seconds(self, work) -> float:
        """The host's seconds of the step: the engine preset's terms, else the time model's host term."""
        eh = self.engine_host
        if eh is not None and eh.source == "engine":
            return eh.seconds(work.num_seqs, work.num_tokens)
        return self._host[work.num_seqs] if work.num_seqs else 0.0

    def breakdown(self, work) -> dict[str, float]:
        """Seconds per component of the step described by ``work``; with an overlapping engine,
        ``host`` is the part of the host's time the GPU step does not hide (the components sum to
        the step's price)."""
        if self.pipeline is not None:
            return self._breakdown_pipeline(work)
        moe_tokens = work.num_tokens
        work = slowest_rank_work(work, self.dp_ranks)
        n = work.num_tokens
        m = self.dense_tokens(work) if self._graph_size else n
        out = {"layers": 0.0, "attention": 0.0, "communication": 0.0, "lm_head": 0.0,
               "host": self.host_seconds(work),
               "swap": work.swap_blocks * self._block / self._host_link,
               "copy": 2 * work.copy_blocks * self._block / self._hbm}
        if n:
            out["layers"] = self._layers[m]
            out["lm_head"] = self._lm_head[work.num_sampled]
            if self._allreduce is not None:
                out["communication"] = self._allreduce[m]
            flops = work.attended * self._attn_flops_per_attended
            nbytes = (work.context_tokens + n) * self._kv_per_token + n * self._qo_per_token
            out["attention"] = self.num_layers * self._ops.attention(flops, nbytes)
        if self.moe is not None:
            out.update(self.moe.breakdown(moe_tokens))
        if self.engine_host is not None and self.engine_host.overlap:
            gpu = sum(v for k, v in out.items() if k != "host")
            out["host"] = max(0.0, out["host"] - gpu)
        return out

    def predict(self, work) -> float:
        # breakdown() summed, inlined: this runs once per simulated step
        n = work.num_tokens
        t = self._host[work.num_seqs] if work.num_seqs else 0.0
        if n:
            t += self._layers[n] + self._lm_head[work.num_sampled]
            if self._allreduce is not None:
                t += self._allreduce[n]
            nbytes = (work.context_tokens + n) * self._kv_per_token + n * self._qo_per_token
            t += self.num_layers * self._ops.attention(work.attended * self._attn_flops_per_attended, nbytes)
        if work.swap_out_blocks or work.swap_in_blocks or work.copy_blocks:
            t += (work.swap_out_blocks + work.swap_in_blocks) * self._block / self._host_link
            t += 2 * work.copy_blocks * self._block / self._hbm
        return t

    def _predict_with_graphs(self, work) -> float:
        """:meth:`predict` with CUDA graphs: a decode-only step that fits a captured size is priced
        at it (layers, all-reduces); counted for :meth:`timing_summary` (the clock prices each
        step once)."""
        n = work.num_tokens
        if not n or n != work.decode_seqs or n >= len(self._graph_size):
            return StepPricer.predict(self, work)
        m = self._graph_size[n]
        self.graph_steps += 1
        self.graph_tokens += n
        self.graph_padding_tokens += m - n
        t = self._host[work.num_seqs] + self._layers[m] + self._lm_head[work.num_sampled]
        if self._allreduce is not None:
            t += self._allreduce[m]
        nbytes = (work.context_tokens + n) * self._kv_per_token + n * self._qo_per_token
        t += self.num_layers * self._ops.attention(work.attended * self._attn_flops_per_attended, nbytes)
        if work.swap_out_blocks or work.swap_in_blocks or work.copy_blocks:
            t += (work.swap_out_blocks + work.swap_in_blocks) * self._block / self._host_link
            t += 2 * work.copy_blocks * self._block / self._hbm
        return t


    def _predict_dp_attention(self, work) -> float:
        """:meth:`predict` under data-parallel attention: the slowest rank's share of the step
        (:func:`servelab.sim.dp_attention.slowest_rank_work`) through the replicated layers, attention,
        LM head and host (CUDA graphs at its decode batch, the engine preset's host and overlap), plus the
        routed experts and all-to-all of every rank's tokens."""
        rank = slowest_rank_work(work, self.dp_ranks)
        n = rank.num_tokens
        gpu = 0.0
        if n:
            self.dp_steps += 1
            self.dp_imbalance_sum += n * self.dp_ranks / work.num_tokens
            m = n
            if n == rank.decode_seqs and n < len(self._graph_size):
                m = self._graph_size[n]
                self.graph_steps += 1
                self.graph_tokens += n
                self.graph_padding_tokens += m - n
            gpu = self._layers[m] + self._lm_head[rank.num_sampled]
            nbytes = (rank.context_tokens + n) * self._kv_per_token + n * self._qo_per_token
            gpu += self.num_layers * self._ops.attention(rank.attended * self._attn_flops_per_attended, nbytes)
            if self.moe is not None:
                gpu += self.moe.seconds(work.num_tokens)
        if work.swap_out_blocks or work.swap_in_blocks or work.copy_blocks:
            gpu += (work.swap_out_blocks + work.swap_in_blocks) * self._block / self._host_link
            gpu += 2 * work.copy_blocks * self._block / self._hbm
        host = self.host_seconds(rank)
        return max(gpu, host) if self.engine_host is not None and self.engine_host.overlap else gpu + host

    def _micro_batch_parts(self, mb, experts: Callable[[int], float] | None
                           ) -> tuple[list[float], float, float, float, int]:
        """One micro-batch as one rank prices it: (each stage's layers' seconds: its layer curve, all-reduces
        and attention, at the captured graph's size for a decode-only one; the experts' seconds over every MoE
        layer from ``experts(tokens)``; the LM head; the host; its tokens)."""
        n = mb.num_tokens
        host = self.host_seconds(mb)
        share = self.pipeline.layout.layer_share  # type: ignore[union-attr]
        if not n:
            return [0.0] * len(share), 0.0, 0.0, host, 0
        m = n
        if self._graph_size and n == mb.decode_seqs and n < len(self._graph_size):
            m = self._graph_size[n]
            self.graph_steps += 1
            self.graph_tokens += n
            self.graph_padding_tokens += m - n
        reduce = self._allreduce[m] if self._allreduce is not None else 0.0
        nbytes = (mb.context_tokens + n) * self._kv_per_token + n * self._qo_per_token
        attention = self.num_layers * self._ops.attention(mb.attended * self._attn_flops_per_attended, nbytes)
        if self._stage_curves:
            stages = [curve[m] + (reduce + attention) * f for curve, f in zip(self._stage_curves, share)]
        else:
            every = self._layers[m] + reduce + attention
            stages = [every * f for f in share]
        return stages, experts(n) if experts is not None else 0.0, self._lm_head[mb.num_sampled], host, n

    def _pipeline_traffic(self, work) -> float:
        """Swaps and copies under PP: every rank moves its own stage's part of each block, the largest stage's at once."""
        if not (work.swap_out_blocks or work.swap_in_blocks or work.copy_blocks):
            return 0.0
        block = self._block * max(self.pipeline.layout.layer_share)  # type: ignore[union-attr]
        return (work.swap_out_blocks + work.swap_in_blocks) * block / self._host_link + 2 * work.copy_blocks * block / self._hbm

    def _predict_pipeline(self, work) -> float:
        """:meth:`predict` under pipeline parallelism: one round of the micro-batches the step is dealt into
        through the stages (:mod:`servelab.sim.pipeline`), plus its swaps and copies."""
        books = self.pipeline
        experts = self.moe.seconds if self.moe is not None else None
        parts = [self._micro_batch_parts(mb, experts)
                 for mb in split_work(work, books.layout.stages)]  # type: ignore[union-attr]
        in_loop = not (self.engine_host is not None and self.engine_host.overlap)
        return books.round_seconds(parts, in_loop) + self._pipeline_traffic(work)  # type: ignore[union-attr]

    def _breakdown_pipeline(self, work) -> dict[str, float]:
        """Under PP: the busiest stage's compute (``stages``), the rest of the round (``pipeline_wait``: transfers,
        the host in a micro-batch's loop, uneven stages or micro-batches), swaps and copies; they sum to the price.
        Priced on a copy of the books (the run's figures and expert draws are not disturbed)."""
        books = PipelineBooks(self.pipeline.layout)  # type: ignore[union-attr]
        counters = (self.graph_steps, self.graph_tokens, self.graph_padding_tokens)
        moe = self.moe
        experts = (lambda n: sum(moe.breakdown(n).values())) if moe is not None else None
        parts = [self._micro_batch_parts(mb, experts) for mb in split_work(work, books.layout.stages)]
        self.graph_steps, self.graph_tokens, self.graph_padding_tokens = counters
        in_loop = not (self.engine_host is not None and self.engine_host.overlap)
        total = books.round_seconds(parts, in_loop)
        lay, busiest = books.layout, books.last_busiest
        block = self._block * max(lay.layer_share)
        return {"stages": busiest, "pipeline_wait": total - busiest,
                "swap": work.swap_blocks * block / self._host_link, "copy": 2 * work.copy_blocks * block / self._hbm}

    def _predict_engine(self, work) -> float:
        """:meth:`predict` under an engine preset (``context.engine_host``): the GPU part as
        :meth:`predict` / :meth:`_predict_with_graphs` price it, the host part from the preset's
        terms (or the time model's), summed, or overlapped (``max``) where the engine overlaps."""
        n = work.num_tokens
        gpu = 0.0
        if n:
            m = n
            if n == work.decode_seqs and n < len(self._graph_size):
                m = self._graph_size[n]
                self.graph_steps += 1
                self.graph_tokens += n
                self.graph_padding_tokens += m - n
            gpu = self._layers[m] + self._lm_head[work.num_sampled]
            if self._allreduce is not None:
                gpu += self._allreduce[m]
            nbytes = (work.context_tokens + n) * self._kv_per_token + n * self._qo_per_token
            gpu += self.num_layers * self._ops.attention(work.attended * self._attn_flops_per_attended, nbytes)
            if self.moe is not None:
                gpu += self.moe.seconds(n)
        if work.swap_out_blocks or work.swap_in_blocks or work.copy_blocks:
            gpu += (work.swap_out_blocks + work.swap_in_blocks) * self._block / self._host_link
            gpu += 2 * work.copy_blocks * self._block / self._hbm
        host = self.host_seconds(work)
        return max(gpu, host) if self.engine_host.overlap else gpu + host  # type: ignore[union-attr]


def _stage_curve(layer: ArrayFn, moe_dense: ArrayFn, layers: int, moe_layers: int) -> ArrayFn:
    """A pipeline stage's layer curve: its dense layers' and its MoE layers' dense parts (experts apart)."""
    return lambda m: (layers - moe_layers) * layer(m) + moe_layers * moe_dense(m)


def graph_sizes(sizes) -> list[int]:
    """``[b] -> the smallest captured size >= b`` for every batch 0..max(sizes) (``[]``: no graphs)."""
    sizes = sorted(set(int(s) for s in sizes))
    if not sizes:
        return []
    if sizes[0] < 1:
        raise ValueError(f"sim.cuda_graph_sizes={sizes}: every capture size must be >= 1")
    out, j = [0], 0
    for b in range(1, sizes[-1] + 1):
        while sizes[j] < b:
            j += 1
        out.append(sizes[j])
    return out


class DraftPricer:
    """Seconds of proposing drafts (:class:`~servelab.core.step_work.DraftWork`).

    A draft model (``context.draft_shape``, run on rank 0 without tensor parallelism) makes
    ``num_passes`` decode passes over the drafting sequences: each pass is priced like a target
    decode step of that shape (its layers, attention over the sequences' contexts, its LM head),
    without all-reduces or a second host term. A drafter without a model (n-gram lookup) costs the
    per-sequence part of the host term for each sequence it drafted for.
    """

    def __init__(self, context: TimeModelContext, ops: GpuOps, host: _Dense, layer: ArrayFn | None = None) -> None:
        self._host = host
        self._pass = None
        shape = context.draft_shape
        if shape is not None:
            one_rank = TimeModelContext(shape=shape, hardware=context.hardware, tensor_parallel_size=1,
                                        dtype=context.dtype, weight_dtype_bytes=context.weight_dtype_bytes,
                                        kv_dtype_bytes=context.kv_dtype_bytes, block_size=context.block_size,
                                        kv_scale_bytes=context.kv_scale_bytes)
            act = 2.0
            layer = layer or (lambda m: ops.layer(m, shape, 1, act, context.weight_dtype_bytes))
            self._pass = StepPricer(one_rank, ops, layer=layer, allreduce=None, host=lambda m: 0.0 * m)

    def predict(self, draft) -> float:
        if not draft.num_seqs:
            return 0.0
        if draft.runs_model and self._pass is not None:
            n = draft.num_seqs
            one = StepWork(num_tokens=n, num_seqs=n, decode_seqs=n, num_sampled=n, attended=draft.context_tokens,
                           context_tokens=draft.context_tokens)
            return draft.num_passes * self._pass.predict(one)
        n = draft.num_seqs
        return self._host[2 * n] - self._host[n]  # what n more sequences add to the host's step
