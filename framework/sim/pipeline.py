"""Pipeline parallelism in the simulator (``pipeline_parallel_size=p``): the stages, the batches in flight,
the activation transfer between stages and the bubbles.

**Layout.** The layers split into ``p`` stages as vLLM splits them (:func:`servelab.core.parallel_layout.
pipeline_stages`: ``layers // p`` each, the remainder one more each on the stages before the last, which
holds the LM head); each stage runs on ``tensor_parallel_size`` ranks, and holds only its layers' weights
and KV (:func:`servelab.sim.executor.plan_memory`). Stages are laid from the start of a node, so stage ``j``
sits on node ``j * tp // gpus_per_node``: a hop between stages on one node crosses NVLink
(``hardware.intra_node_link_gb_s``), a hop between nodes the network (``hardware.inter_node_link_gb_s``).

**Batches in flight.** vLLM runs ``p`` batches at once (its virtual engines / ``max_concurrent_batches``),
each a disjoint set of sequences; Vidur simulates the same with one micro-batch per stage. The engine here
schedules one batch per step; under PP a step is one *round* of the pipeline in which the batch's sequences,
dealt into ``p`` micro-batches, each pass every stage once (so every sequence advances one token per round,
as it does per step without PP). The deal (:func:`split_work`): decode sequences evenly (the first
micro-batches one more), prompt chunks whole, chunk ``k`` to micro-batch ``p - 1 - k % p``; a micro-batch's
attention work is its token share of the step's, its KV reads its sequence share.

**A round's time.** With ``t[i][j]`` micro-batch ``i``'s compute on stage ``j`` (its layers' seconds: the layer
curve of its dense and MoE layers, its share of the all-reduces and attention, its MoE layers' share of the experts
the micro-batch touches; plus the LM head on the last stage), ``x[i][j]`` its activation transfer from stage ``j`` to
``j + 1`` (``2 x hidden x tokens x activation bytes``: vLLM hands the hidden states and the residual to the
next stage, over one GPU's link per TP rank, plus the link's latency) and ``h[i]`` the host's work on it,

    T = max( max_i (h[i] + sum_j t[i][j] + sum_j x[i][j]),    a micro-batch's own loop: serial stages
             max_j sum_i t[i][j],                             a stage busy with every micro-batch
             sum_i h[i] )                                     the host (one driver) serving every micro-batch
        + swap and copy traffic (each rank its stage's share of a block)

the steady-state cycle time of ``p`` micro-batches circulating through ``p`` stages when every round repeats
(the bound on a timed event graph's cycle from its micro-batch and stage circuits; equal to an event
simulation of the repeated round for stage times of the form priced here, tests/test_pipeline_sim.py). With an engine preset that
overlaps the host (``engine.overlap``), ``h[i]`` leaves the micro-batch's loop and only the host's own circuit
remains. What the stages do not compute is the bubble (``pipeline_bubble_share`` in the summary): the
transfers and the host in a micro-batch's loop, stages of unequal layers, and micro-batches of unequal work
(a prompt chunk in one of them holds every other one to its pace).
"""

from __future__ import annotations

from dataclasses import dataclass

from servelab.core.shapes import HardwareProfile, ModelShape
from servelab.core.step_work import StepWork

ACTIVATION_TENSORS = 2  # the hidden states and the residual (vLLM's IntermediateTensors for Llama-family models)


@dataclass(frozen=True)
class StageLayout:
    """The stages of one engine: each stage's share of the layers and of the MoE layers, and each hop's link."""

    layers: tuple[int, ...]  # layers per stage
    layer_share: tuple[float, ...]  # stage layers / all layers
    moe_share: tuple[float, ...]  # stage MoE layers / all MoE layers (0s for a dense model)
    hops: tuple[tuple[float, float], ...]  # (bytes/s, latency s) of stage j -> j + 1
    hop_bytes_per_token: float
    inter_node_hops: int

    @property
    def stages(self) -> int:
        return len(self.layers)

    def describe(self) -> str:
        """The banner's words: stages, layers per stage, the link between them."""
        hops = len(self.hops)
        where = ("NVLink" if not self.inter_node_hops else
                 "the network" if self.inter_node_hops == hops else f"{self.inter_node_hops} of {hops} hops between nodes")
        return (f"{self.stages} stages of {'/'.join(map(str, self.layers))} layers, {self.stages} batches in flight; "
                f"activations ({self.hop_bytes_per_token:,.0f} B per token) between stages over {where}")


def stage_layout(shape: ModelShape, hardware: HardwareProfile, tp: int, pp: int, gpus_per_node: int,
                 act_bytes: float = 2.0) -> StageLayout:
    """The layout of ``pp`` stages of ``tp`` ranks each, laid from the start of a node (module doc)."""
    stages = shape.stage_layers(pp)
    moe_total = shape.num_moe_layers if shape.is_moe else 0
    moe = tuple(sum(shape.is_moe_layer(i) for i in r) / moe_total if moe_total else 0.0 for r in stages)
    node = [j * tp // gpus_per_node for j in range(pp)]
    same = [node[j] == node[j + 1] for j in range(pp - 1)]
    return StageLayout(tuple(len(r) for r in stages), tuple(len(r) / shape.num_layers for r in stages), moe,
                       tuple(hardware.kv_link(s) for s in same), ACTIVATION_TENSORS * shape.hidden_size * act_bytes,
                       same.count(False))


def split_work(work: StepWork, pp: int) -> list[StepWork]:
    """The ``pp`` micro-batches a step's work is dealt into (module doc); swaps and copies stay the round's."""
    n, seqs, decodes = work.num_tokens, work.num_seqs, work.decode_seqs
    chunks = seqs - decodes
    chunk_tokens = n - decodes - work.draft_tokens
    dealt = [decodes // pp + (i < decodes % pp) for i in range(pp)]
    whole = [chunks // pp + (pp - 1 - i < chunks % pp) for i in range(pp)]
    ctoks = [chunk_tokens * c // chunks if chunks else 0 for c in whole]
    if chunks:  # the rounding's remainder to the micro-batch dealt the first chunk
        ctoks[-1] += chunk_tokens - sum(ctoks)
    out = []
    for d, c, ct in zip(dealt, whole, ctoks):
        drafts = work.draft_tokens * d // decodes if decodes else 0
        tokens, s = d + ct + drafts, d + c
        out.append(StepWork(num_tokens=tokens, num_seqs=s,
                            prefill_tokens=work.prefill_tokens * ct // chunk_tokens if chunk_tokens else 0,
                            decode_seqs=d, num_sampled=work.num_sampled * s // seqs if seqs else 0,
                            attended=work.attended * tokens // n if n else 0,
                            context_tokens=work.context_tokens * s // seqs if seqs else 0, draft_tokens=drafts))
    return out


class PipelineBooks:
    """A round's time from its micro-batches' parts (module doc), and the figures the summary reports."""

    def __init__(self, layout: StageLayout) -> None:
        self.layout = layout
        self.rounds = 0
        self.busy = 0.0  # stage-seconds computed, summed over stages and rounds
        self.span = 0.0  # stage-seconds available: stages x round time, summed
        self.transfer_s = 0.0  # activation transfers, every hop of every micro-batch
        self.last_busiest = 0.0  # the last round's busiest stage (its compute seconds)

    def round_seconds(self, parts: list[tuple[list[float], float, float, float, int]], host_in_loop: bool) -> float:
        """``parts``: per micro-batch ``(each stage's layers' seconds, the MoE experts' seconds over every MoE
        layer, LM head seconds, host seconds, tokens)`` as one rank of ``tp`` prices them."""
        lay = self.layout
        last = lay.stages - 1
        stage_busy = [0.0] * lay.stages
        loop, host = 0.0, 0.0
        for layers, experts, lm_head, h, tokens in parts:
            own = h if host_in_loop else 0.0
            host += h
            if tokens:
                for j in range(lay.stages):
                    t = layers[j] + experts * lay.moe_share[j] + (lm_head if j == last else 0.0)
                    stage_busy[j] += t
                    own += t
                nbytes = tokens * lay.hop_bytes_per_token
                moved = sum(nbytes / bw + latency for bw, latency in lay.hops)
                self.transfer_s += moved
                own += moved
            loop = max(loop, own)
        self.last_busiest = max(stage_busy)
        seconds = max(loop, self.last_busiest, host)
        if seconds > 0:
            self.rounds += 1
            self.busy += sum(stage_busy)
            self.span += lay.stages * seconds
        return seconds

    def summary(self) -> dict:
        lay = self.layout
        return {"pipeline_stages": lay.stages, "pipeline_stage_layers": list(lay.layers),
                "pipeline_inter_node_hops": lay.inter_node_hops, "pipeline_rounds": self.rounds,
                "pipeline_bubble_share": 1.0 - self.busy / self.span if self.span else 0.0,
                "pipeline_transfer_s": self.transfer_s}
