"""``time_model=roofline``: step time from FLOPs and bytes against a hardware spec sheet.

Per step, on one rank of ``tp`` (every rank does the same work in parallel):

- linear layers (q/k/v/o, gate/up/down of every layer, the LM head for sampled rows): FLOPs
  ``2 x tokens x params / tp``; bytes = the weights, read once per step, plus each matmul's input
  and output activations. Time ``max(flops / (peak x flops_efficiency), bytes / (hbm x
  bandwidth_efficiency))``.
- attention: FLOPs ``4 x attended x heads/tp x head_dim x layers`` (QK^T and PV); bytes = the KV
  every scheduled sequence reads (its whole context, once per layer) plus the KV written for the
  new tokens. Same max.
- tensor parallel: ``allreduces_per_layer`` all-reduces per layer of ``tokens x hidden`` values,
  ring cost ``2 (tp - 1) / tp x bytes / (link x link_efficiency) + link latency``.
- swap copies: bytes over the host link; block copies: read + write over HBM.
- a fixed ``step_overhead_ms`` (scheduling, launches, sampling on the host).
- a mixture-of-experts model: the routed experts a step's tokens touch, each ``max(flops, bytes)``
  (its weights read once, its tokens' compute), the slowest expert-parallel group per layer, and the
  EP all-to-all (:mod:`servelab.sim.moe_pricer`); the rest of a MoE layer (attention, router, shared
  experts) with the linear layers above.

The embedding table is looked up, not read: it costs nothing here. Quantisation changes bytes, not
FLOPs: ``model.quantization=int8`` reads the decoder linears at 1 byte per weight (plus a float32
scale per output channel; the matmul still runs at the dtype's peak, as weight-only kernels do),
``kv_cache_dtype=int8|fp8_e4m3`` reads and writes 1 byte per K/V value plus a scale per token and head.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from servelab.plugin_api import INT8_SCALE_BYTES, TimeModel, TimeModelContext
from servelab.time_model_api import MoePricer, routing_for


@dataclass
class RooflineConfig:
    flops_efficiency: float = 0.6  # achieved / peak tensor FLOP/s of large GEMMs (MFU-like)
    bandwidth_efficiency: float = 0.8  # achieved / spec HBM bandwidth of streaming reads
    link_efficiency: float = 0.7  # achieved / spec bus bandwidth of NCCL ring all-reduce
    allreduces_per_layer: int = 2  # Megatron: after attention and after the MLP
    step_overhead_ms: float = 2.0  # host side per step: scheduling, kernel launches, sampling
    activation_dtype_bytes: float = 2.0


class RooflineTime(TimeModel):
    name = "roofline"
    Config = RooflineConfig

    def __init__(self, config: RooflineConfig, context: TimeModelContext) -> None:
        super().__init__(config, context)
        for key in ("flops_efficiency", "bandwidth_efficiency", "link_efficiency"):
            value = getattr(config, key)
            if not 0 < value <= 1:
                raise ValueError(f"time_model.{key}={value} must be in (0, 1]")
        if config.step_overhead_ms < 0:
            raise ValueError(f"time_model.step_overhead_ms={config.step_overhead_ms} must be >= 0")
        s, hw, tp = context.shape, context.hardware, context.tensor_parallel_size
        act = config.activation_dtype_bytes
        self._flops = hw.peak_tflops * 1e12 * config.flops_efficiency
        self._hbm = hw.hbm_bandwidth_gb_s * 1e9 * config.bandwidth_efficiency
        # linear layers, per rank
        self._layer_params = s.num_layers * s.layer_linear_params / tp
        self._head_params = s.vocab_size * s.hidden_size / tp
        # quantised decoder linears (model.quantization=int8) are read at their stored size, scales included
        if context.linear_weight_bytes is None:
            layer_bytes = self._layer_params * context.weight_dtype_bytes
        else:
            layer_bytes = (self._layer_params * context.linear_weight_bytes
                           + s.num_layers * s.layer_linear_rows / tp * INT8_SCALE_BYTES)
        self._moe = None
        allreduces = config.allreduces_per_layer * s.num_layers
        if s.is_moe:  # the routed experts are priced per step from those touched (MoePricer), the rest here
            expert_params = s.num_moe_layers * s.num_experts * 3 * s.hidden_size * s.moe_intermediate_size / tp
            layer_bytes *= 1 - expert_params / self._layer_params
            self._layer_params -= expert_params
            self._moe = self._moe_pricer(config, context)
            if self._moe.all_to_all is not None:  # the combine returns a MoE layer's output, not an all-reduce
                allreduces -= s.num_moe_layers
        self._weight_read = layer_bytes + self._head_params * context.weight_dtype_bytes
        h, inter = s.hidden_size, s.intermediate_size
        per_layer_io = (h + (s.q_dim + 2 * s.kv_dim) / tp) + (s.q_dim / tp + h) + (h + 2 * inter / tp) + (inter / tp + h)
        self._act_per_token = s.num_layers * per_layer_io * act
        # attention, per rank
        self._attn_flops_per_attended = 4 * (s.num_heads / tp) * s.head_dim * s.num_layers
        self._kv_per_token = context.kv_bytes_per_token
        self._qo_per_token = 2 * (s.q_dim / tp) * s.num_layers * act
        # communication
        if tp > 1:
            link = hw.link_bandwidth_gb_s * 1e9 * config.link_efficiency
            self._ring_s_per_byte = 2 * (tp - 1) / tp / link
            self._allreduces = allreduces
            self._allreduce_latency = hw.link_latency_us * 1e-6
        else:
            self._ring_s_per_byte = self._allreduces = self._allreduce_latency = 0
        self._hidden_bytes = h * act
        self._host = hw.host_link_gb_s * 1e9
        self._block = context.bytes_per_block
        self._overhead = config.step_overhead_ms * 1e-3

    def _moe_pricer(self, config: RooflineConfig, context: TimeModelContext) -> MoePricer:
        """Each touched expert: ``max(2 x tokens x 3 x hidden x width / flops, (its weights + its tokens'
        activations) / HBM)`` on a rank holding ``width = moe_intermediate_size / (tp / ep)`` of it."""
        s, act = context.shape, config.activation_dtype_bytes
        width = s.moe_intermediate_size / (context.tensor_parallel_size // context.expert_parallel_size)
        params = 3 * s.hidden_size * width
        weight = params * (context.linear_weight_bytes or context.weight_dtype_bytes)
        io = (2 * s.hidden_size + 3 * width) * act
        flops, hbm = self._flops, self._hbm

        def experts(counts: np.ndarray) -> np.ndarray:
            return np.where(counts > 0, np.maximum(2 * counts * params / flops, (weight + counts * io) / hbm), 0.0)

        return MoePricer(s, context.hardware, context.tensor_parallel_size, context.expert_parallel_size,
                         routing_for(context), experts, 0.0, act, "the roofline", context.moe_ep_exchange,
                         context.expert_placement, context.linear_weight_bytes or context.weight_dtype_bytes,
                         context.expert_cache)

    @property
    def moe_label(self) -> str | None:
        return self._moe.label() if self._moe is not None else None

    def moe_summary(self) -> dict:
        """For ``summary.json`` (a MoE model): its routing and experts touched (no ``timing_summary``:
        this model does not price the engine timing features)."""
        return self._moe.summary() if self._moe is not None else {}

    def breakdown(self, work) -> dict[str, float]:
        """Seconds per component (linear, attention, communication, swap, copy, overhead)."""
        flops = 2 * (work.num_tokens * self._layer_params + work.num_sampled * self._head_params)
        nbytes = self._weight_read + work.num_tokens * self._act_per_token
        linear = max(flops / self._flops, nbytes / self._hbm) if work.num_tokens else 0.0
        attn_flops = work.attended * self._attn_flops_per_attended
        attn_bytes = (work.context_tokens + work.num_tokens) * self._kv_per_token + work.num_tokens * self._qo_per_token
        attention = max(attn_flops / self._flops, attn_bytes / self._hbm)
        comm = 0.0
        if self._allreduces and work.num_tokens:
            comm = self._allreduces * (work.num_tokens * self._hidden_bytes * self._ring_s_per_byte + self._allreduce_latency)
        out = {"linear": linear, "attention": attention, "communication": comm,
               "swap": work.swap_blocks * self._block / self._host,
               "copy": 2 * work.copy_blocks * self._block / self._hbm,
               "overhead": self._overhead}
        if self._moe is not None:
            out.update(self._moe.breakdown(work.num_tokens))
        return out

    def predict(self, work) -> float:
        # breakdown() inlined: this runs once per simulated step
        n = work.num_tokens
        t = self._overhead
        if n:
            flops = 2 * (n * self._layer_params + work.num_sampled * self._head_params)
            nbytes = self._weight_read + n * self._act_per_token
            t += max(flops / self._flops, nbytes / self._hbm)
            if self._allreduces:
                t += self._allreduces * (n * self._hidden_bytes * self._ring_s_per_byte + self._allreduce_latency)
            attn_bytes = (work.context_tokens + n) * self._kv_per_token + n * self._qo_per_token
            t += max(work.attended * self._attn_flops_per_attended / self._flops, attn_bytes / self._hbm)
            if self._moe is not None:
                t += self._moe.seconds(n)
        if work.swap_out_blocks or work.swap_in_blocks or work.copy_blocks:
            t += (work.swap_out_blocks + work.swap_in_blocks) * self._block / self._host
            t += 2 * work.copy_blocks * self._block / self._hbm
        return t

    def swap_bytes_per_s(self) -> float:
        return self._host

    def describe(self) -> dict:
        hw = self.context.hardware
        return {"name": self.name, **vars(self.config), "hardware": hw.name,
                "weight_bytes_per_rank": self.context.weight_bytes_per_rank,
                "kv_bytes_per_token_per_rank": self.context.kv_bytes_per_token}
