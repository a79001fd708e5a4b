"""The conformance kit's expert placement checks (``servelab check-plugin expert_placement=<name>``).

A placement never changes what is computed, only which rank runs each expert, so it is checked on its
plans and in the simulator:

- on synthetic layouts (16 experts x 3 MoE layers over 1, 2, 4 and 8 ranks; the plugin's own
  redundant experts where they divide over the ranks), the plan for no load, a uniform load, skewed
  loads, all tokens on one expert and an all-zero load: "every expert placed", "plan fits the layout",
  and the same plan asked twice and from a fresh plugin ("deterministic plans");
- one simulator run (``model=qwen3_30b_a3b``, TP 4 x EP 4 on H100, skewed routing, a short
  workload) twice: it finishes every request and the two runs give the same figures.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from servelab.kit.moe_sim_runs import check_two_runs
from servelab.kit.stage_info import StageInfo

if TYPE_CHECKING:
    from servelab.kit.conformance import Failure, KitRun

EXPERTS, LAYERS = 16, 3
RUN = ("backend=sim", "model=qwen3_30b_a3b", "hardware=h100", "tensor_parallel_size=4", "expert_parallel_size=4",
       "sim.moe.routing_skew=1.2", "workload.num_requests=24", "logger=none", "progress=false")


def loads(seed: int) -> list[tuple[str, np.ndarray | None]]:
    """The loads every layout's plans are asked for: ``(what, [layers, experts] tokens or None)``."""
    rng = np.random.default_rng(seed)
    zipf = rng.permuted(np.tile(1000.0 / np.arange(1, EXPERTS + 1) ** 1.2, (LAYERS, 1)), axis=1).round()
    one = np.zeros((LAYERS, EXPERTS))
    one[:, rng.integers(EXPERTS)] = 5000
    return [("no load yet", None), ("uniform", np.full((LAYERS, EXPERTS), 100.0)), ("Zipf 1.2", zipf),
            ("random", rng.integers(0, 500, (LAYERS, EXPERTS)).astype(float)), ("one hot expert", one),
            ("all zero", np.zeros((LAYERS, EXPERTS)))]


def check_expert_placement(run: "KitRun") -> "Failure | None":
    from servelab.api import compose  # noqa: PLC0415 - above the kit's core imports
    from servelab.assemble.executor import plugin_config  # noqa: PLC0415
    from servelab.kit.conformance import Failure  # noqa: PLC0415 - the kit's module imports this one by name

    cls = run.registry.get("expert_placement", run.name)
    config = plugin_config(compose([f"expert_placement={run.name}", *run.extra]).expert_placement)
    layouts = 0
    for ep in (1, 2, 4, 8):
        failure = _check_layout(cls, config, ep, run.seed, Failure)
        if failure is not None:
            return failure
        layouts += 1
    overrides = (*RUN, f"seed={run.seed}", f"expert_placement={run.name}", *run.extra)
    failure = check_two_runs(overrides, run.registry, raised="every expert placed", unfinished="every expert placed",
                             differ="deterministic plans")
    if failure is not None:
        return failure
    run.report.cases = layouts * len(loads(run.seed)) + 2
    run.report.notes.append(f"expert placement: {layouts} layouts x {len(loads(run.seed))} loads of {EXPERTS} experts "
                            f"x {LAYERS} layers, and two simulator runs of qwen3_30b_a3b at TP 4 x EP 4")
    return None


check_expert_placement.stage_info = StageInfo(  # type: ignore[attr-defined]
    "plans and runs", "24 plans, 2 simulator runs", False,
    f"the plan for 6 loads (none, uniform, skewed, random, one hot expert, zero) on {EXPERTS} experts x {LAYERS} "
    "MoE layers over 1, 2, 4 and 8 ranks, each asked twice and of a fresh plugin; then two runs of "
    "qwen3_30b_a3b at TP 4 x EP 4 under skewed routing")


def _check_layout(cls, config, ep: int, seed: int, Failure) -> "Failure | None":
    """Every load's plan on ``EXPERTS`` experts over ``ep`` ranks."""
    from servelab.core.errors import ConfigError  # noqa: PLC0415
    from servelab.core.expert_placement import ExpertPlacementContext, check_plan  # noqa: PLC0415

    extra = int(cls.redundant_experts(config))
    if extra % ep:
        return None  # this plugin's settings do not divide over ep ranks: the run refuses them (one line)
    context = ExpertPlacementContext(EXPERTS, LAYERS, ep, (EXPERTS + extra) // ep, seed)
    where = f"{EXPERTS} experts x {LAYERS} MoE layers over ep={ep} ranks, {context.slots_per_rank} slots each"
    try:
        plugin, fresh = cls(config, context), cls(config, context)
    except Exception as exc:  # noqa: BLE001
        return Failure("plan fits the layout", f"building it for {where} raised {type(exc).__name__}: {exc}")
    for what, load in loads(seed):
        try:
            plan = plugin.place(None if load is None else load.copy())
            checked = check_plan(plan, context, f"the plan for load {what!r} on {where}")
        except ConfigError as exc:
            contract = "every expert placed" if "no replica" in str(exc) else "plan fits the layout"
            return Failure(contract, str(exc))
        except Exception as exc:  # noqa: BLE001
            return Failure("plan fits the layout", f"place() for load {what!r} on {where} raised "
                           f"{type(exc).__name__}: {exc}")
        again = plugin.place(None if load is None else load.copy())
        other = fresh.place(None if load is None else load.copy())
        if not (np.array_equal(checked, again) and np.array_equal(checked, other)):
            return Failure("deterministic plans", f"load {what!r} on {where} gave different plans when asked again "
                           "or asked of a fresh plugin")
    return None

