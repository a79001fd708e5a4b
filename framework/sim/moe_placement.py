"""An expert placement as the simulator runs it: each step's tokens per expert spread over the slots
of the plan (:mod:`servelab.core.expert_placement`), the load measured for re-plans, and the expert
weights a re-plan moves priced over the intra-node link.

- **Tokens per slot**: an expert's tokens split evenly over its replicas (each of ``r`` gets ``c // r``,
  and ``c % r`` of them one more), as SGLang's and vLLM's EPLB dispatch spreads an expert's tokens over
  its physical copies. Which replicas take the leftover tokens rotates step by step, each expert from
  an offset of its own (seeded): with few tokens per step (decode) a fixed choice would send every hot
  expert's tokens to the same replica, the imbalance replicas exist to remove. Without replicas a
  slot's tokens are its expert's: under ``linear`` exactly the array the pricer had before placements
  existed.
- **Measured load**: the tokens per expert of the last ``load_window_steps`` steps before each re-plan
  (every step since the previous plan when 0 or longer than the interval).
- **Moving weights**: a re-plan moves, to each rank, the replicas it did not hold in that layer before
  (a shard of ``moe_intermediate_size / (tp / ep)`` of gate, up and down per GPU); every rank receives
  at once over the intra-node link (``hardware.intra_node_link_gb_s``, the link the KV hand-off uses),
  so the move takes the most loaded rank's bytes over it plus one latency, charged to the step that
  re-plans (the engines stop the world for it: vLLM's and SGLang's EPLB rearrange between steps).
"""

from __future__ import annotations

import numpy as np

from servelab.core.expert_placement import ExpertPlacement, ExpertPlacementContext, check_plan
from servelab.core.shapes import HardwareProfile


class PlacedExperts:
    """One run's placement: :meth:`tokens_per_slot` for a step's counts, :meth:`after_step` to measure
    load and re-plan (returns the seconds a re-plan's moves cost)."""

    def __init__(self, placement: ExpertPlacement, context: ExpertPlacementContext, hardware: HardwareProfile,
                 replica_bytes: float) -> None:
        self.placement, self.context = placement, context
        self.name = getattr(placement, "name", type(placement).__name__)
        self._who = f"expert_placement={self.name}"
        self._link_bytes_per_s, self._link_latency_s = hardware.kv_link(True)
        self._replica_bytes = replica_bytes
        self.every = int(getattr(placement, "replan_every_steps", 0) or 0)
        window = int(getattr(placement, "load_window_steps", 0) or 0)
        self.window = window if 0 < window < self.every else self.every
        self._use(check_plan(placement.place(None), context, self._who))
        self._load = np.zeros((context.num_moe_layers, context.num_experts), dtype=np.int64)
        self.steps = 0
        self.replans = 0
        self.moved_replicas = 0
        self.move_seconds = 0.0

    def _use(self, plan: np.ndarray) -> None:
        c = self.context
        self.plan = plan  # [layers, ep, slots]
        flat = plan.reshape(c.num_moe_layers, -1)
        rows = np.arange(c.num_moe_layers)[:, None]
        replicas = np.zeros((c.num_moe_layers, c.num_experts), dtype=np.int64)
        np.add.at(replicas, (rows, flat), 1)
        self._replicas = replicas[rows, flat]  # [layers, slots in all]: its expert's replica count
        order = np.argsort(flat, axis=1, kind="stable")  # a replica's index among its expert's: rank of slot
        seen = np.empty_like(flat)
        sorted_ids = np.take_along_axis(flat, order, axis=1)
        first = np.concatenate([np.ones((c.num_moe_layers, 1), bool), sorted_ids[:, 1:] != sorted_ids[:, :-1]], 1)
        run_start = np.maximum.accumulate(np.where(first, np.arange(flat.shape[1]), 0), axis=1)
        np.put_along_axis(seen, order, np.arange(flat.shape[1]) - run_start, axis=1)
        offset = np.random.default_rng([c.seed, 4]).integers(0, 1 << 30, (c.num_moe_layers, c.num_experts))
        self._replica_index = seen + offset[rows, flat]  # rotated by the step count in tokens_per_slot
        self._flat = flat
        self.replicated = bool((self._replicas > 1).any())

    def tokens_per_slot(self, counts: np.ndarray) -> np.ndarray:
        """``[layers, ep, slots]`` tokens each slot's expert copy runs, from ``[layers, experts]`` counts."""
        c = np.take_along_axis(counts, self._flat, axis=1)
        if self.replicated:
            turn = (self._replica_index + self.steps) % self._replicas
            c = c // self._replicas + (turn < c % self._replicas)
        return c.reshape(self.plan.shape)

    def after_step(self, counts: np.ndarray) -> float:
        """Count the step; measure its load when a re-plan is due within the window; re-plan when due
        and return the seconds the moved replicas take (0 otherwise)."""
        self.steps += 1
        if not self.every:
            return 0.0
        if self.every - (self.steps - 1) % self.every <= self.window:
            self._load += counts
        if self.steps % self.every:
            return 0.0
        new = check_plan(self.placement.place(self._load.copy()), self.context, self._who)
        self._load[:] = 0
        seconds = self._move(new)
        self._use(new)
        self.replans += 1
        return seconds

    def _move(self, new: np.ndarray) -> float:
        """Seconds to bring every rank the replicas it lacks under ``new`` (all ranks at once)."""
        c = self.context
        layers, ep, _ = new.shape
        held = np.zeros((layers, ep, c.num_experts), dtype=bool)
        wanted = np.zeros_like(held)
        ix = np.arange(layers)[:, None, None], np.arange(ep)[None, :, None]
        held[ix[0], ix[1], self.plan] = True
        wanted[ix[0], ix[1], new] = True
        arriving = (wanted & ~held).sum(axis=(0, 2))  # [ep]: replicas each rank receives, all layers
        self.moved_replicas += int(arriving.sum())
        if not arriving.any():
            return 0.0
        seconds = self._link_latency_s + float(arriving.max()) * self._replica_bytes / self._link_bytes_per_s
        self.move_seconds += seconds
        return seconds

    def summary(self) -> dict:
        out: dict = {"moe_expert_placement": self.name}
        if self.every:
            out.update(moe_placement_replans=self.replans, moe_replicas_moved=self.moved_replicas,
                       moe_replica_move_s=self.move_seconds)
        return out
