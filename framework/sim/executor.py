"""``backend=sim``: an executor with no weights and no tensors.

It answers each step with placeholder tokens (never EOS: a request generates exactly its
``max_tokens``) and sizes the KV pool the way a GPU run would: device memory x
``gpu_memory_utilization``, minus this rank's share of the weights, minus an activation reserve,
over the KV bytes of one block on one rank. Time is not its business: on ``clock=virtual`` the
time model prices every step. Tensor parallelism is a number.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

from servelab.core.errors import ConfigError
from servelab.core.contexts import ExecutorContext
from servelab.core.executor import BackendConfig, Executor, StepOutput
from servelab.core.step_work import StepWork
from servelab.core.model_spec import ModelSpec
from servelab.core.shapes import HardwareProfile, ModelShape

log = logging.getLogger(__name__)

PLACEHOLDER_TOKEN = 0


@dataclass(frozen=True)
class SimMemory:
    """How the device memory of one rank is spent."""

    device_bytes: float
    usable_bytes: float
    weight_bytes: float
    activation_reserve_bytes: float
    kv_bytes: float
    bytes_per_block: float
    num_blocks: int  # the engine's pool: this rank's blocks x dp_ranks
    dp_ranks: int = 1  # data_parallel_attention: ranks each holding its own sequences' KV (1: the KV is sharded)


def plan_memory(shape: ModelShape, hardware: HardwareProfile, tp: int, weight_dtype_bytes: float,
                kv_dtype_bytes: float, block_size: int, gpu_memory_utilization: float,
                activation_reserve_gb: float, linear_weight_bytes: float | None = None,
                kv_scale_bytes: float = 0.0, ep: int = 1, pp: int = 1, redundant_expert_bytes: float = 0.0,
                dp_attention: bool = False) -> SimMemory:
    """The KV pool one rank can hold; raises :class:`ConfigError` when the weights do not fit.

    ``linear_weight_bytes`` / ``kv_scale_bytes``: quantised decoder linears and KV cache
    (:class:`servelab.core.shapes.StorageBytes`). ``ep``: a MoE layer's experts split that many ways
    over the ``tp`` ranks (the same bytes per rank). ``pp`` stages: each rank holds its stage's weights
    and KV; one allocator's blocks hold on every stage, so the pool is the fewest any stage can hold
    (the plan reports that stage's figures). ``redundant_expert_bytes``: one rank's replicas of hot experts
    beyond its share (``expert_placement=eplb``), held on top of its weights. ``dp_attention``
    (``data_parallel_attention=true``): every weight but the routed experts replicated on each of the ``tp``
    ranks, each rank the whole KV of its own sequences (no head split, no latent replicated), so the
    engine's one pool is ``tp`` ranks' blocks (``dp_ranks``; the blocks are one rank's)."""
    shape.check_parallel(tp, ep, pp)
    usable = hardware.memory_bytes * gpu_memory_utilization
    reserve = activation_reserve_gb * 1e9
    plans = []
    for index, layers in enumerate(shape.stage_layers(pp)):
        weights = (shape.dp_attention_weight_bytes_per_rank(weight_dtype_bytes, tp, linear_weight_bytes)
                   if dp_attention else shape.weight_bytes_per_rank(weight_dtype_bytes, tp, linear_weight_bytes, pp,
                                                                    index)) + redundant_expert_bytes
        per_block = shape.kv_bytes_per_token(kv_dtype_bytes, 1 if dp_attention else tp, kv_scale_bytes,
                                             len(layers)) * block_size
        kv = usable - weights - reserve
        if kv < per_block:
            at = f"tensor_parallel_size={tp}" + (f" (pipeline stage {index} of {pp})" if pp > 1 else "") + \
                (" with data_parallel_attention=true (attention weights replicated)" if dp_attention else "")
            raise ConfigError(
                f"the weights do not fit: {weights / 1e9:.1f} GB per rank at {at} "
                f"(+ {reserve / 1e9:.1f} GB activation reserve) but {hardware.name} offers {usable / 1e9:.1f} GB per "
                f"rank ({hardware.memory_gb:g} GB x gpu_memory_utilization={gpu_memory_utilization}); "
                "raise tensor_parallel_size" + (" or pipeline_parallel_size" if shape.num_layers > pp else "")
                + " or pick larger hardware")
        ranks = tp if dp_attention else 1
        plans.append(SimMemory(hardware.memory_bytes, usable, weights, reserve, kv, per_block,
                               int(kv // per_block) * ranks, ranks))
    return min(plans, key=lambda p: p.num_blocks)


def sim_spec(shape: ModelShape, name: str) -> ModelSpec:
    """A :class:`ModelSpec` for the engine's checks (vocabulary, positions); no EOS."""
    return ModelSpec(architecture=name or "sim", family="sim", vocab_size=shape.vocab_size,
                     hidden_size=shape.hidden_size, intermediate_size=shape.intermediate_size,
                     num_layers=shape.num_layers, num_heads=shape.num_heads, num_kv_heads=shape.num_kv_heads,
                     head_dim=shape.head_dim, rms_norm_eps=1e-6,
                     max_position_embeddings=shape.max_position_embeddings,
                     tie_word_embeddings=shape.tie_word_embeddings, qkv_bias=False, qk_norm=False,
                     rope_type="default", rope_theta=1e4, eos_token_ids=())


class SimExecutor(Executor):
    """Placeholder tokens, a KV pool sized from the hardware, no tensors: the engine hands it
    the step's :class:`~servelab.core.step_work.StepWork`, never a batch."""

    name = "sim"
    needs_batch = False
    computes_tokens = False
    placeholder_token = PLACEHOLDER_TOKEN

    def __init__(self, config: BackendConfig, context: ExecutorContext) -> None:
        """``context``: the model's ``shape``, the ``hardware`` it is priced on, the ``memory`` plan
        (:func:`plan_memory`), ``num_kv_blocks`` (None: the plan's), the host swap pool."""
        super().__init__(config, context)
        shape, hardware, memory = context.shape, context.hardware, context.memory
        if shape is None or hardware is None or memory is None:
            raise ConfigError("backend=sim: the executor context must give the model's shape, the hardware "
                              "and the memory plan")
        num_kv_blocks, swap_space_gb = context.num_kv_blocks, context.swap_space_gb
        num_swap_blocks, model_name = context.num_swap_blocks or 0, context.model_name
        self._shape = shape
        self.hardware = hardware
        self.memory = memory if num_kv_blocks is None else replace(memory, num_blocks=num_kv_blocks)
        self.spec = sim_spec(shape, model_name)
        self.num_kv_blocks = self.memory.num_blocks
        self.bytes_per_block = int(memory.bytes_per_block)
        self.num_swap_blocks = (int(swap_space_gb * 2**30 // memory.bytes_per_block) if swap_space_gb is not None
                                else num_swap_blocks)
        pp = context.pipeline_parallel_size
        log.info("sim: %s, %.1f GB weights + %.1f GB reserve per rank%s, %d KV blocks (%.2f GB)%s, %d host swap blocks",
                 hardware.name, memory.weight_bytes / 1e9, memory.activation_reserve_bytes / 1e9,
                 f" (its stage's layers, {pp} pipeline stages)" if pp > 1 else "",
                 self.num_kv_blocks, self.num_kv_blocks * memory.bytes_per_block / 1e9,
                 f" over {memory.dp_ranks} data-parallel attention ranks" if memory.dp_ranks > 1 else "",
                 self.num_swap_blocks)

    def execute_work(self, work: StepWork) -> StepOutput:
        return StepOutput([PLACEHOLDER_TOKEN] * work.num_sampled, 0.0)

    def execute(self, batch) -> StepOutput:
        return StepOutput([PLACEHOLDER_TOKEN] * batch.num_sampled, 0.0)

    def measure_swap_bandwidth(self) -> float:
        return self.hardware.host_link_gb_s * 1e9

    @property
    def shape(self) -> ModelShape:
        return self._shape

    def summary(self) -> dict:
        m = self.memory
        out = {"sim_weight_bytes_per_rank": m.weight_bytes,
               "sim_kv_pool_bytes_per_rank": self.num_kv_blocks * m.bytes_per_block / m.dp_ranks,
               "sim_activation_reserve_bytes": m.activation_reserve_bytes, "sim_usable_bytes_per_rank": m.usable_bytes}
        if m.dp_ranks > 1:  # data_parallel_attention: the engine's pool spans the ranks' own pools
            out.update(sim_attention_dp_ranks=m.dp_ranks, sim_kv_pool_bytes_total=self.num_kv_blocks * m.bytes_per_block)
        return out
