"""What each conformance stage runs, as data: the pages (``docs/plugins.md``, each guide's
"What check-plugin runs") are generated from it, so a page cannot claim a count the kit does not run.

A stage is named in a kind's ``KindSpec.checks`` (a name of :data:`servelab.kit.conformance.STAGES`
or ``"module:function"``). Its :class:`StageInfo` comes from :data:`STAGE_INFO` (the built-in
stages, keyed like ``checks``) or, for a stage a package adds, from a ``stage_info`` attribute on
its function. :func:`stage_info` names a stage that has neither: the docs check fails on it rather
than leave the stage out of a page.

The counts are computed from the stages' own constants (the fast-forward runs, the evictor's
scripts and pools, the disaggregated requests), not retyped.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from servelab.kit import (conformance_disagg, conformance_evictor, conformance_fast_forward, conformance_router,
                          conformance_slo_mix)

#: ``servelab check-plugin``'s default for ``--cases`` (``check_plugin(cases=...)`` defaults to 20).
DEFAULT_CASES = 50


@dataclass(frozen=True)
class StageInfo:
    """One stage of ``check-plugin``, as a page states it.

    ``title``: a short name; ``runs``: how many runs or scenarios it makes, as text (``--cases``
    where that option sets it); ``uses_cases``: whether ``--cases`` changes what it runs; ``what``:
    what it checks, one line; ``real_model``: whether ``--no-real-model`` skips it; ``when``: a
    condition for it to run at all ("" = always; every stage after a failed one is skipped)."""

    title: str
    runs: str
    uses_cases: bool
    what: str
    real_model: bool = False
    when: str = ""


_FF_RUNS = len(conformance_fast_forward.RUNS)
_LADDER = len(conformance_evictor.ladder())

STAGE_INFO: dict[str, StageInfo] = {
    "scenarios": StageInfo(
        "random scenarios", f"`--cases` (default {DEFAULT_CASES}), each again with aborts", True,
        "random workloads x small pools x chunked prefill on/off x block sizes on the KV-checking fake executor, "
        "the other plugins drawn from the built-ins, then again with about a third of its requests aborted: "
        "budget, seats, blocks, victims, KV integrity, every request ends, no leak, tokens equal the default stack's",
        when="a drafter that needs a draft model skips it"),
    "state": StageInfo(
        "state left behind", "1", False,
        "a fixed run where sequences finish, are preempted and are aborted: afterwards the plugin holds nothing "
        "for any of them"),
    "starvation": StageInfo(
        "starvation bound", "1", False,
        "one seat, a long request among short urgent ones: it starts within `max_wait_s`",
        when="only a scheduler whose `Config` has `max_wait_s`"),
    "slo_mix": StageInfo(
        "mixed SLOs", f"{len(conformance_slo_mix.SLO_MIX_SEEDS)}", False,
        f"fixed scenarios whose requests carry {len(conformance_slo_mix.SLO_CLASSES)} SLO classes "
        "(tight, loose, none) and priorities, arriving in bursts into a small pool, so a deadline- or "
        "priority-aware order reorders and preempts: the random scenarios' contracts, aborts included"),
    "servelab.kit.conformance_disagg:check_disaggregated": StageInfo(
        "KV through a connector", "1", False,
        f"the scheduler on the decode side of a prefill/decode pair: {conformance_disagg.NUM_REQUESTS} requests "
        f"whose KV a connector loads (some asynchronously) into a {conformance_disagg.DECODE_BLOCKS}-block pool; "
        "tokens equal one engine's, no block held on either side"),
    "real_model": StageInfo(
        "real model", "1", False, "4 greedy requests on the tiny random model (`model=tiny`): tokens equal the "
        "default stack's", real_model=True),
    "servelab.kit.conformance_fast_forward:check_fast_forward": StageInfo(
        "fast-forward exact", f"{_FF_RUNS} simulated runs, each twice", False,
        "`backend=sim` runs (light load, memory-tight, shared prefixes, few seats, mixed SLO classes) with "
        "`sim.fast_forward` on and off: identical `summary.json` and `requests.jsonl`"),
    "predictions": StageInfo(
        "predictions", "1", False, "every request of 3 scenarios asked twice, of two instances: a finite "
        "number >= 0, the same every time", when="a predictor that predicts (not `none`)"),
    "evictor_script": StageInfo(
        "event script", f"{len(conformance_evictor.SCRIPT_SEEDS)}", False,
        f"the evictor alone through {conformance_evictor.SCRIPT_EVENTS} seeded cache events each "
        f"({conformance_evictor.SCRIPT_BLOCKS} blocks): every `evict()` answer checked"),
    "evictor_ladder": StageInfo(
        "pool ladder", f"{_LADDER} (the large pools also with `lru`)", False,
        "a fixed shared-prefix workload through pools from large to thrashing: tokens equal, hits equal lru's "
        "and the ideal's where the pool holds every block, every block reusable afterwards"),
    "router": StageInfo(
        "clusters", f"`--cases` synthetic clusters, 1 spread check, {len(conformance_router.SIM_CLUSTERS)} simulated "
        "clusters", True, "placement (offered replica, can hold, both pools), determinism, causality, spread over "
        "equal replicas, then `backend=sim` clusters ("
        + "; ".join(f"`{' '.join(shape)}`" for shape in conformance_router.SIM_CLUSTERS)
        + f"; {conformance_router.SIM_CLUSTER_REQUESTS} requests each): every request ends once, no block held"),
    "servelab.cli.route_conformance:stage_behind_route": StageInfo(
        "behind servelab route", "1", False, "the router in a real `servelab route` over two `model=tiny_code` "
        "replicas: completions and chat, streamed and not, each answered, each replica ran what the router placed "
        "there", real_model=True),
    "servelab.kit.conformance_kv_tiers:check_kv_tier_policy": StageInfo(
        "tier ledger", "`--cases`, at most 3 (the first twice)", True,
        "multi-turn chats on the simulator over a GPU pool, a host tier and a disk tier far below the working "
        "set; every store, move, drop, load and prefetch replayed against a ledger"),
}


class UndescribedStage(LookupError):
    """A kind names a stage whose runs no page could state."""


def stage_info(stage: str) -> StageInfo:
    """The :class:`StageInfo` of ``stage`` (a name in a kind's ``checks``): :data:`STAGE_INFO`'s,
    else the ``stage_info`` attribute of the ``"module:function"`` it names."""
    if stage in STAGE_INFO:
        return STAGE_INFO[stage]
    info = None
    if ":" in stage:
        module, _, attr = stage.partition(":")
        try:
            info = getattr(getattr(importlib.import_module(module), attr), "stage_info", None)
        except (ImportError, AttributeError):
            info = None
    if not isinstance(info, StageInfo):
        raise UndescribedStage(f"conformance stage {stage!r} has no StageInfo: give its function a `stage_info = "
                               "StageInfo(...)` attribute (servelab.kit.stage_info), or add it to STAGE_INFO there "
                               "for a built-in stage")
    return info
