"""The conformance kit's expert cache checks (``servelab check-plugin expert_cache=<name>``).

A cache never changes what is computed, only which experts wait for the host link, so it is checked on
its resident sets and in the simulator:

- on synthetic layouts (16 experts x 3 MoE layers over 1, 2 and 4 ranks, caches of 1 expert, half the
  share and all of it per rank and layer; an all-resident cache such as ``none`` only the last), 24
  steps of routing (Zipf, uniform, one hot expert, nothing, everything) through the simulator's
  :class:`servelab.sim.moe_cache.CachedExperts`: "capacity never exceeded" for the first set and every
  answer, "routed experts resident when priced" (hits + misses are the routed slots, the misses are the
  routed slots not resident, a step with misses stalls), and the same sets from a fresh plugin fed the
  same routing ("deterministic caches");
- one simulator run (``model=qwen3_30b_a3b`` on one H100, skewed routing, half the experts offloaded, a
  short workload) twice: it finishes every request and the two runs give the same figures.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from servelab.kit.moe_sim_runs import check_two_runs
from servelab.kit.stage_info import StageInfo

if TYPE_CHECKING:
    from servelab.kit.conformance import Failure, KitRun

EXPERTS, LAYERS, STEPS = 16, 3, 24
RUN = ("backend=sim", "model=qwen3_30b_a3b", "hardware=h100", "sim.moe.routing_skew=1.2", "workload.num_requests=16",
       "workload.output_len.max=32", "logger=none", "progress=false")


def routing(seed: int, ep: int) -> list[np.ndarray]:
    """``STEPS`` steps of tokens per slot ``[layers, ep, EXPERTS // ep]``: Zipf draws of a few tokens
    (decode-like) and of many (prefill-like), with a step of nothing, of everything and of one hot expert."""
    rng = np.random.default_rng([seed, ep])
    p = 1.0 / np.arange(1, EXPERTS + 1) ** 1.2
    p /= p.sum()
    steps = []
    for i in range(STEPS):
        tokens = (2, 8, 64)[i % 3]
        counts = np.stack([rng.multinomial(tokens, rng.permutation(p) if i % 7 == 0 else p) for _ in range(LAYERS)])
        if i == 5:
            counts[:] = 0
        if i == 11:
            counts[:] = 3
        if i == 17:
            counts[:] = 0
            counts[:, rng.integers(EXPERTS)] = 50
        steps.append(counts.reshape(LAYERS, ep, EXPERTS // ep))
    return steps


def check_expert_cache(run: "KitRun") -> "Failure | None":
    from servelab.api import compose  # noqa: PLC0415 - above the kit's core imports
    from servelab.assemble.executor import plugin_config  # noqa: PLC0415
    from servelab.kit.conformance import Failure  # noqa: PLC0415 - the kit's module imports this one by name

    cls = run.registry.get("expert_cache", run.name)
    config = plugin_config(compose([f"expert_cache={run.name}", *run.extra]).expert_cache)
    layouts = 0
    for ep in (1, 2, 4):
        share = EXPERTS // ep
        for slots in sorted({share} if cls.all_resident else {1, share // 2 or 1, share}):
            failure = _check_layout(cls, config, ep, slots, run.seed, Failure)
            if failure is not None:
                return failure
            layouts += 1
    offloaded = "0" if cls.all_resident else "64"
    overrides = (*RUN, f"seed={run.seed}", f"expert_cache={run.name}", f"sim.moe.expert_cache_slots={offloaded}",
                 *run.extra)
    failure = check_two_runs(overrides, run.registry, raised="capacity never exceeded",
                             unfinished="routed experts resident when priced", differ="deterministic caches")
    if failure is not None:
        return failure
    run.report.cases = layouts * STEPS + 2
    run.report.notes.append(f"expert cache: {layouts} layouts x {STEPS} steps of {EXPERTS} experts x {LAYERS} layers, "
                            "and two simulator runs of qwen3_30b_a3b on one H100")
    return None


check_expert_cache.stage_info = StageInfo(  # type: ignore[attr-defined]
    "resident sets and runs", "up to 216 steps, 2 simulator runs", False,
    f"{STEPS} steps of routing (Zipf, none, all, one hot expert) on {EXPERTS} experts x {LAYERS} MoE layers over "
    "1, 2 and 4 ranks with caches of 1, half and all of a rank's experts, each through the simulator's pricing and "
    "again through a fresh plugin; then two runs of qwen3_30b_a3b on one H100 with half the experts offloaded")


class _Link:
    name, host_link_gb_s = "kit", 1.0  # 1 GB/s: any load is visible as a stall


def _check_layout(cls, config, ep: int, slots: int, seed: int, Failure) -> "Failure | None":
    """``STEPS`` steps of routing through a cache of ``slots`` per rank and layer over ``ep`` ranks."""
    from servelab.core.errors import ConfigError  # noqa: PLC0415
    from servelab.core.expert_cache import ExpertCacheContext  # noqa: PLC0415
    from servelab.sim.moe_cache import CachedExperts  # noqa: PLC0415

    context = ExpertCacheContext(EXPERTS, LAYERS, ep, EXPERTS // ep, slots, seed)
    where = f"{EXPERTS} experts x {LAYERS} MoE layers over ep={ep} ranks, {slots} of {EXPERTS // ep} cached"
    try:
        priced = CachedExperts(cls(config, context), context, _Link(), 1e6, None)  # type: ignore[arg-type]
        fresh = cls(config, context)
        shadow = fresh.start()
    except ConfigError as exc:
        return Failure("capacity never exceeded", f"{where}: {exc}")
    except Exception as exc:  # noqa: BLE001
        return Failure("capacity never exceeded", f"building it for {where} raised {type(exc).__name__}: {exc}")
    for i, per_slot in enumerate(routing(seed, ep)):
        before, misses = priced.resident.copy(), priced.misses
        try:
            stall = priced.step(int(per_slot.sum()), per_slot, np.full(LAYERS, 1e-4))
        except ConfigError as exc:
            return Failure("capacity never exceeded", f"step {i} on {where}: {exc}")
        except Exception as exc:  # noqa: BLE001
            return Failure("capacity never exceeded", f"keep() at step {i} on {where} raised {type(exc).__name__}: {exc}")
        wanted = int(((per_slot > 0) & ~before).sum())
        if priced.misses - misses != wanted or (wanted and stall <= 0):
            return Failure("routed experts resident when priced", f"step {i} on {where}: {wanted} routed experts were "
                           f"not resident but {priced.misses - misses} were loaded (stall {stall:.3g} s)")
        shadow = fresh.keep(shadow.copy(), per_slot.copy())
        if not np.array_equal(np.asarray(shadow), priced.resident):
            return Failure("deterministic caches", f"step {i} on {where}: a fresh plugin fed the same routing "
                           "kept a different resident set")
    return None

