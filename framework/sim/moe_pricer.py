"""A MoE step's expert cost from the experts its tokens touch, and expert parallelism's all-to-all.

Per MoE layer of a step, from :class:`servelab.sim.moe_routing.ExpertRouting`'s tokens per expert:

- **Experts** (``expert_parallel_size = ep`` groups of ``tp / ep`` ranks; the slots of each group as the
  ``expert_placement`` plugin places them, :mod:`servelab.sim.moe_placement`: by default expert ``e`` on
  group ``e // (num_experts / ep)``, vLLM's and SGLang's linear placement; a replicated expert's tokens
  split over its copies, and a re-plan's moved weights priced on the step that re-plans). A rank runs its group's touched
  experts as one grouped kernel (one launch floor per layer, vLLM's ``fused_moe``), each touched expert
  ``gate_up`` and ``down`` GEMMs of its own tokens against its ``moe_intermediate_size / (tp / ep)``
  shard: its weights read once, its compute from its tokens (the per-expert price is the time model's
  GEMM without its floor). Untouched experts cost nothing. The slowest group sets the layer's time
  (routing imbalance shows as a longer step).
- **All-to-all** (``ep > 1``): a dispatch and a combine per MoE layer, each moving the tokens the most
  loaded group receives (``(ep - 1) / ep`` of them from other groups) x ``hidden`` x activation bytes
  at DeepEP's measured bottleneck bandwidth for that many ranks (``servelab/data/moe/deepep_all_to_all.json``:
  H800 figures, scaled to this hardware's link by the ratio of link speeds), plus the hardware's
  ``link_latency_us``. The MoE layer's MLP all-reduce is replaced by the combine (the attention's stays).
  ``sim.moe.ep_exchange=all_reduce`` prices what ``backend=tp``'s EP does instead: the batch is on every
  rank, each group runs its experts, and the MoE layer's all-reduce sums them (no dispatch, no all-to-all).

The attention, the router, the shared experts and the token-wise kernels run on every token: the
time model prices them with the dense part of the layer.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np

from servelab.core.errors import ConfigError
from servelab.core.shapes import HardwareProfile, ModelShape
from servelab.sim.moe_cache import CachedExperts, offload_check
from servelab.sim.moe_placement import PlacedExperts
from servelab.sim.moe_routing import ExpertRouting

EP_EXCHANGES = ("all_to_all", "all_reduce")
ALL_TO_ALL_FILE = Path(__file__).resolve().parents[1] / "data" / "moe" / "deepep_all_to_all.json"

# seconds of each expert's GEMMs, [layers, experts] tokens -> [layers, experts] (0 where no tokens)
ExpertFn = Callable[[np.ndarray], np.ndarray]


@dataclass(frozen=True)
class AllToAll:
    """One expert-parallel dispatch + combine: ``latency + bytes / bandwidth`` each."""

    ep: int
    dispatch_bytes_per_s: float
    combine_bytes_per_s: float
    latency_s: float
    figure: str  # where the bandwidth came from, for the banner

    @classmethod
    def for_hardware(cls, hardware: HardwareProfile, ep: int, path: Path = ALL_TO_ALL_FILE) -> "AllToAll":
        data = json.loads(Path(path).read_text())
        rows = data["normal"]
        intra = ep <= data["gpus_per_node"]  # within a node: the NVLink row; across nodes the nearest EP >= ep
        row = next(r for r in rows if r["link"] == "nvlink") if intra else \
            next((r for r in rows if r["ep"] >= ep), rows[-1])
        link = hardware.link_bandwidth_gb_s if intra else hardware.inter_node_link_gb_s
        spec = data["link_spec_gb_s"][row["link"]]
        scale = link / spec * 1e9
        return cls(ep, row["dispatch_gb_s"] * scale, row["combine_gb_s"] * scale, hardware.link_latency_us * 1e-6,
                   f"DeepEP's H800 EP {row['ep']} dispatch/combine {row['dispatch_gb_s']}/{row['combine_gb_s']} GB/s "
                   f"({row['link']} {spec} GB/s) scaled to {hardware.name}'s {link:g} GB/s")

    def dispatch_combine(self, received_tokens, dispatch_token_bytes: float,
                         combine_token_bytes: float) -> tuple[np.ndarray, np.ndarray]:
        """Seconds of the dispatch and of the combine, ``received_tokens``: the most loaded group's
        token copies (per layer); ``(ep - 1) / ep`` of them cross the link."""
        received = np.asarray(received_tokens, dtype=float)
        moved = received * (self.ep - 1) / self.ep
        on = received > 0
        return (np.where(on, self.latency_s + moved * dispatch_token_bytes / self.dispatch_bytes_per_s, 0.0),
                np.where(on, self.latency_s + moved * combine_token_bytes / self.combine_bytes_per_s, 0.0))

    def seconds(self, received_tokens: np.ndarray, token_bytes: float) -> np.ndarray:
        """Dispatch + combine of each layer, both in the activations' dtype (``token_bytes`` per token)."""
        dispatch, combine = self.dispatch_combine(received_tokens, token_bytes, token_bytes)
        return dispatch + combine


class MoePricer:
    """The experts and all-to-all of one step: :meth:`seconds` (the step's draw) and :meth:`breakdown`."""

    def __init__(self, shape: ModelShape, hardware: HardwareProfile, tp: int, ep: int, routing: ExpertRouting,
                 expert_fn: ExpertFn, layer_floor_s: float, act_bytes: float, priced_by: str,
                 exchange: str = "all_to_all", placement=None, weight_bytes: float = 2.0, cache=None,
                 dense_fn: Callable | None = None) -> None:
        """``placement``: the run's ``expert_placement`` plugin (None: linear, placed once);
        ``weight_bytes`` per stored expert weight (what a re-plan's moves carry); ``cache``: the run's
        ``expert_cache`` plugin (None or ``none``: every expert resident), ``dense_fn(n)`` one MoE layer's
        dense part at ``n`` tokens (the window its prefetches overlap, :mod:`servelab.sim.moe_cache`)."""
        self.shape, self.tp, self.ep, self.routing, self.priced_by = shape, tp, ep, routing, priced_by
        # the placement's figures in the summary and banner: under EP, or a placement other than the default
        # (a default run without EP keeps the keys it had before placements existed)
        self._states_placement = placement is not None and (ep > 1 or getattr(placement, "name", "") != "linear")
        self.placed = None if placement is None else PlacedExperts(
            placement, placement.context, hardware,
            3 * shape.hidden_size * shape.moe_intermediate_size / (tp // ep) * weight_bytes)
        self.cached = None
        if cache is not None and not getattr(cache, "all_resident", False):
            offload_check(cache, placement)
            self.cached = CachedExperts(cache, cache.context, hardware,
                                        3 * shape.hidden_size * shape.moe_intermediate_size / (tp // ep) * weight_bytes,
                                        dense_fn)
        self._expert_fn, self._floor = expert_fn, layer_floor_s
        self.dp_attention = False  # set by the step pricer under data_parallel_attention (the banner says so)
        self.dp_weight_bytes_per_rank = 0.0
        self._groups = ep
        self._token_bytes = shape.hidden_size * act_bytes
        if exchange not in EP_EXCHANGES:
            raise ConfigError(f"sim.moe.ep_exchange={exchange!r}: choose one of {', '.join(EP_EXCHANGES)}")
        self.exchange = exchange
        self.all_to_all = AllToAll.for_hardware(hardware, ep) if ep > 1 and exchange == "all_to_all" else None
        self._breakdown_rng = np.random.default_rng([routing.seed, 3])
        self.steps = 0
        self.touched_sum = 0.0  # experts touched per MoE layer, summed over steps
        self.imbalance_sum = 0.0  # the most loaded group's tokens / the mean group's, summed over steps
        self.imbalance_max = 0.0
        self.imbalance_token_sum = 0.0  # imbalance x the step's tokens, summed (a token-weighted mean)
        self.tokens = 0

    def _parts(self, counts: np.ndarray) -> tuple[float, float, float, float]:
        """(experts s, all-to-all s, mean experts touched per layer, imbalance) of one step's counts."""
        return self._layer_parts(counts)[:4]

    def _layer_parts(self, counts: np.ndarray):
        """:meth:`_parts`, then the tokens per slot ``[layers, groups, slots]`` and each layer's expert seconds."""
        per_rank = counts.reshape(counts.shape[0], self._groups, -1) if self.placed is None else \
            self.placed.tokens_per_slot(counts)  # [layers, groups, slots per group]
        seconds = self._expert_fn(per_rank.reshape(counts.shape[0], -1)).reshape(per_rank.shape).sum(axis=2)
        touched_groups = (per_rank > 0).any(axis=2)
        per_layer = (seconds + self._floor * touched_groups).max(axis=1)
        experts = float(per_layer.sum())
        received = per_rank.sum(axis=2)
        heaviest = received.max(axis=1)
        comm = float(self.all_to_all.seconds(heaviest, self._token_bytes).sum()) if self.all_to_all else 0.0
        mean = received.mean(axis=1)
        imbalance = float(np.mean(heaviest / np.maximum(mean, 1e-12)))
        return experts, comm, float((counts > 0).sum(axis=1).mean()), imbalance, per_rank, per_layer

    def seconds(self, n: int) -> float:
        """The experts and all-to-all of a step of ``n`` tokens (its routing drawn now; counted for
        :meth:`summary`)."""
        if not n:
            return 0.0
        counts = self.routing.counts(n)
        experts, comm, touched, imbalance, per_rank, per_layer = self._layer_parts(counts)
        if self.cached is not None:  # expert offloading: the misses' loads the layers wait for
            experts += self.cached.step(n, per_rank, per_layer)
        self.steps += 1
        self.touched_sum += touched
        self.imbalance_sum += imbalance
        self.imbalance_max = max(self.imbalance_max, imbalance)
        self.imbalance_token_sum += imbalance * n
        self.tokens += n
        moves = self.placed.after_step(counts) if self.placed is not None else 0.0
        return experts + comm + moves

    def breakdown(self, n: int) -> dict[str, float]:
        """``experts`` and ``all_to_all`` seconds of a step of ``n`` tokens, from a routing drawn on a
        generator of its own (the steps' draws are not disturbed)."""
        if not n:
            return {"experts": 0.0, "all_to_all": 0.0}
        experts, comm, _, _ = self._parts(self.routing.counts(n, self._breakdown_rng))
        return {"experts": experts, "all_to_all": comm}

    def label(self) -> str:
        """The banner's words for how the experts are priced."""
        s = self.shape
        text = (f"MoE {s.num_moe_layers} layers x {s.num_experts} experts top-{s.experts_per_token}, "
                f"routing {self.routing.describe()}; each step's touched experts priced by {self.priced_by}")
        if self.all_to_all:
            text += f"; EP {self.ep} all-to-all from {self.all_to_all.figure}"
        elif self.ep > 1:
            text += f"; EP {self.ep} exchange: the MoE layer's all-reduce (sim.moe.ep_exchange=all_reduce)"
        if self.dp_attention:
            text += (f"; attention data-parallel over {self.tp} ranks (each its own sequences and KV: the KV pool row "
                     f"is all {self.tp} ranks' pools; every weight but the routed experts replicated, "
                     f"{self.dp_weight_bytes_per_rank / 1e9:.1f} GB per rank; a step costs its slowest rank's share, "
                     "the experts see every rank's tokens)")
        if self.cached is not None:
            text += "; " + self.cached.label()
        if self.placed is not None and self._states_placement:
            p = self.placed
            text += f"; expert_placement={p.name} ({p.context.slots_per_rank} slots per rank" + \
                (f", re-planned every {p.every} steps)" if p.every else ")")
        return text

    def summary(self) -> dict:
        """For ``summary.json``: routing, mean experts touched per MoE layer per step, mean imbalance."""
        out = {"moe_routing": self.routing.describe(), "moe_priced_steps": self.steps}
        if self.steps:
            out.update(moe_mean_experts_touched=self.touched_sum / self.steps,
                       moe_mean_group_imbalance=self.imbalance_sum / self.steps)
            if self._states_placement:
                out.update(moe_max_group_imbalance=self.imbalance_max,
                           moe_token_weighted_group_imbalance=self.imbalance_token_sum / self.tokens)
        if self.placed is not None and self._states_placement:
            out.update(self.placed.summary())
        if self.all_to_all:
            out["moe_all_to_all"] = self.all_to_all.figure
        if self.cached is not None:
            out.update(self.cached.summary())
        return out


def gpu_ops_moe(context, ops, act_bytes: float, weight_bytes: float) -> tuple[MoePricer, Callable]:
    """The calibrated roofline's MoE pricing for ``context``: ``(experts pricer, the dense part of a MoE
    layer against tokens)``. ``ops`` is a :class:`servelab.sim.gpu_ops.GpuOps`."""
    s, tp, ep = context.shape, context.tensor_parallel_size, context.expert_parallel_size
    h, width = s.hidden_size, s.moe_intermediate_size / (tp // ep)
    floor = ops.cal.gemm_floor_us * 1e-6
    act_s_per_token = 3 * width * act_bytes / (ops._hbm * ops.cal.act_bw_eff)

    def experts(counts: np.ndarray) -> np.ndarray:
        gemms = ops.gemm(counts, h, 2 * width, act_bytes, weight_bytes) + ops.gemm(counts, width, h, act_bytes,
                                                                                    weight_bytes)
        return np.where(counts > 0, gemms - 2 * floor + counts * act_s_per_token, 0.0)

    attn_tp = context.attention_tp  # 1 under data-parallel attention: whole heads and shared experts per rank
    shared = s.shared_intermediate_size / attn_tp

    def dense_part(m):
        t = sum(ops.layer_op(op, m, s, attn_tp, act_bytes, weight_bytes) for op in ("qkv", "o", "input_norm", "rope",
                                                                                     "post_norm", "add"))
        t = t + ops.gemm(m, h, s.num_experts, act_bytes, context.weight_dtype_bytes)  # the router, replicated
        if shared:
            t = t + ops.gemm(m, h, 2 * shared, act_bytes, weight_bytes) + ops.gemm(m, shared, h, act_bytes, weight_bytes) \
                + ops.tokenwise(m, 3 * shared * act_bytes, "act")
        return t

    routing = routing_for(context)
    layer_floor = 2 * floor + ops.cal.tokenwise_floor_us * 1e-6
    return MoePricer(s, context.hardware, tp, ep, routing, experts, layer_floor, act_bytes,
                     "the calibrated roofline's GEMMs (no op table measures MoE experts)",
                     context.moe_ep_exchange, context.expert_placement, weight_bytes, context.expert_cache,
                     lambda n: dense_part(np.array([n], dtype=float))), dense_part


def routing_for(context) -> ExpertRouting:
    """The routing ``context``'s ``sim.moe`` settings describe (a fresh generator: one per time model)."""
    s = context.shape
    return ExpertRouting(s.num_experts, s.experts_per_token, s.num_moe_layers, context.moe_routing_skew,
                         context.moe_seed, context.moe_routing_trace)
