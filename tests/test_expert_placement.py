"""The expert_placement kind: linear (the default, identical to the pricer before placements), round_robin,
eplb (replicas of hot experts from measured load, re-planned, moves priced), its kit and new-plugin."""

from __future__ import annotations

import sys
import tempfile

import numpy as np
import pytest

from conftest import compose
from servelab.assemble.stack import build_stack
from servelab.core.errors import ConfigError
from servelab.core.expert_placement import ExpertPlacement, ExpertPlacementContext, check_plan
from servelab.core.shapes import HardwareProfile
from servelab.kit.conformance import Failure
from servelab.kit.conformance_expert_placement import _check_layout
from servelab.plugins.expert_placements import EplbPlacement, LinearPlacement, RoundRobinPlacement
from servelab.plugins.expert_placements.eplb import EplbConfig
from servelab.run.session import run_job
from servelab.sim.moe_placement import PlacedExperts

H100 = HardwareProfile("h100", 80, 3350, 989, 450, 64)
MOE = ("backend=sim", "model=qwen3_30b_a3b", "hardware=h100", "tensor_parallel_size=8", "expert_parallel_size=8",
       "sim.moe.routing_skew=1.2")


def context(experts=8, layers=2, ep=4, redundant=0):
    return ExpertPlacementContext(experts, layers, ep, (experts + redundant) // ep)


def test_linear_and_round_robin_place_every_expert_once():
    c = context()
    assert LinearPlacement(None, c).place(None)[0].tolist() == [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert RoundRobinPlacement(None, c).place(None)[1].tolist() == [[0, 4], [1, 5], [2, 6], [3, 7]]


def test_eplb_replicates_the_hot_expert_and_balances_the_ranks():
    c = context(redundant=4)
    load = np.array([[800, 100, 100, 100, 100, 100, 100, 100]] * 2, dtype=float)
    plan = check_plan(EplbPlacement(EplbConfig(num_redundant_experts=4), c).place(load), c, "eplb")
    assert (plan[0] == 0).sum() == 5  # the expert with 8x the load: its own slot and the four redundant ones
    split = PlacedExperts(EplbPlacement(EplbConfig(num_redundant_experts=4), c), c, H100, 1.0)
    split._use(plan)
    per_rank = split.tokens_per_slot(load.astype(np.int64)).sum(axis=2)
    linear = load.reshape(2, 4, 2).sum(axis=2)
    assert per_rank.max() / per_rank.mean() < linear.max() / linear.mean()
    assert per_rank.sum() == load.sum()  # every token runs once


def test_a_replicated_experts_tokens_split_evenly_and_all_run():
    c = context(experts=4, layers=1, ep=2, redundant=2)

    class Fixed(ExpertPlacement):
        name = "fixed"

        def place(self, load):
            return np.array([[[0, 0, 1], [0, 2, 3]]])

    placed = PlacedExperts(Fixed(None, c), c, H100, 1.0)
    counts = np.array([[10, 5, 1, 0]])
    slots = placed.tokens_per_slot(counts)
    expert0 = [slots[0, 0, 0], slots[0, 0, 1], slots[0, 1, 0]]
    assert sorted(expert0) == [3, 3, 4] and slots[0, 0, 2] == 5 and slots[0, 1, 1:].tolist() == [1, 0]
    taken = np.zeros(3)
    for _ in range(3):  # the leftover token rotates: over three steps each replica takes it once
        placed.after_step(counts)
        s = placed.tokens_per_slot(counts)
        taken += [s[0, 0, 0], s[0, 0, 1], s[0, 1, 0]]
    assert taken.tolist() == [10, 10, 10]


def test_a_replan_moves_only_the_replicas_a_rank_lacks_and_prices_them_on_the_intra_node_link():
    c = context(experts=4, layers=1, ep=2)

    class Swap(ExpertPlacement):
        name = "swap"
        replan_every_steps = 2

        def place(self, load):
            return np.array([[[0, 1], [2, 3]]]) if load is None else np.array([[[0, 2], [1, 3]]])

    placed = PlacedExperts(Swap(None, c), c, H100, 450e9 / 1000)  # a replica: 1 ms over 450 GB/s
    counts = np.array([[1, 1, 1, 1]])
    assert placed.after_step(counts) == 0.0
    seconds = placed.after_step(counts)
    assert placed.moved_replicas == 2 and seconds == pytest.approx(1e-3 + H100.intra_node_latency_us * 1e-6)


def test_the_default_prices_exactly_as_without_a_placement():
    stack = build_stack(compose(*MOE))
    pricer = stack.time_model.chosen.pricer.moe if hasattr(stack.time_model, "chosen") else None
    pricer = pricer or stack.time_model.pricer.moe
    assert pricer.placed is not None and pricer.placed.name == "linear"
    counts = np.random.default_rng(0).integers(0, 40, (pricer.shape.num_moe_layers, pricer.shape.num_experts))
    with_plan = pricer._parts(counts)
    pricer.placed = None
    assert pricer._parts(counts) == with_plan


def summary(*overrides):
    with tempfile.TemporaryDirectory() as out:
        return run_job(compose(*MOE, "workload.num_requests=40", "workload.arrival=all_at_once", *overrides), out).summary


def test_eplb_under_skew_lowers_the_imbalance_reserves_its_replicas_and_prices_its_moves():
    linear = summary()
    eplb = summary("expert_placement=eplb", "expert_placement.num_redundant_experts=16",
                   "expert_placement.step_interval=50", "expert_placement.window_size=25")
    assert linear["moe_expert_placement"] == "linear"  # stated under EP
    assert eplb["moe_token_weighted_group_imbalance"] < linear["moe_token_weighted_group_imbalance"]
    assert eplb["moe_placement_replans"] >= 2 and eplb["moe_replica_move_s"] > 0
    assert eplb["moe_mean_group_imbalance"] < linear["moe_mean_group_imbalance"]
    assert eplb["sim_kv_pool_bytes_per_rank"] < linear["sim_kv_pool_bytes_per_rank"]  # 2 replicas a rank, 48 layers


def test_redundant_experts_that_do_not_divide_over_the_ranks_are_one_line_naming_the_key():
    with pytest.raises(ConfigError, match="expert_placement=eplb: 3 redundant experts must be a multiple of "
                                          "expert_parallel_size=8"):
        build_stack(compose(*MOE, "expert_placement=eplb", "expert_placement.num_redundant_experts=3"))


def test_a_real_backend_refuses_a_placement_it_cannot_run():
    with pytest.raises(ConfigError, match="expert_placement=eplb is priced by the simulator only"):
        build_stack(compose("model=tiny_moe", "expert_placement=eplb"))


def test_a_dense_model_builds_with_any_placement():
    stack = build_stack(compose("backend=sim", "model=llama3_8b", "expert_placement=eplb"))
    assert stack.plugins["expert_placement"].context.num_experts == 0


def test_the_kit_passes_the_builtins_and_names_a_placement_that_drops_an_expert():
    for cls, config in ((LinearPlacement, None), (RoundRobinPlacement, None), (EplbPlacement, EplbConfig(8))):
        assert all(_check_layout(cls, config, ep, 0, Failure) is None for ep in (1, 2, 4, 8))

    class Drops(LinearPlacement):
        def place(self, load):
            plan = super().place(load)
            plan[plan == 0] = 1
            return plan

    failure = _check_layout(Drops, None, 2, 0, Failure)
    assert failure is not None and failure.contract == "every expert placed"


def test_new_plugin_writes_a_placement_that_passes_the_layout_checks(tmp_path, monkeypatch):
    from servelab.kit.new_plugin import new_plugin

    root = new_plugin("expert_placement", "snake_spread", tmp_path)
    monkeypatch.syspath_prepend(str(root))
    import servelab_snake_spread as module

    try:
        for ep in (1, 2, 4, 8):
            assert _check_layout(module.SnakeSpread, module.SnakeSpreadConfig(num_redundant_experts=8), ep, 0,
                                 Failure) is None
    finally:
        sys.modules.pop("servelab_snake_spread", None)


@pytest.mark.slow
def test_check_plugin_passes_eplb():
    from servelab.testing import check_plugin

    assert check_plugin("expert_placement", "eplb").ok
