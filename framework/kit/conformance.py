"""The conformance kit: run one plugin through the properties the project checks on its built-ins.

    from servelab.testing import check_plugin
    report = check_plugin("scheduler", "spf", cases=30)
    assert report.ok, report          # str(report): each broken contract and how to reproduce it

or ``servelab check-plugin scheduler=spf`` (exit code 0 only when it passes). Two parts:

1. **Random scenarios** (:mod:`servelab.kit.conformance_cases`: random workloads x small pools x
   chunked prefill on/off x block sizes, the other plugins drawn from the built-ins) on the
   KV-checking fake executor. Contracts, each failure named by one of :data:`CONTRACTS`: every
   plan within the token budget and ``max_num_seqs``, with blocks allocated for every scheduled
   chunk starting at ``num_computed_tokens``; victims chosen among the candidates offered; the
   KV cache reads back what was written; every valid request finishes (or is rejected because it
   can never fit the pool) and every invalid one is rejected with a reason; no block leaks;
   tokens equal the default stack's; drafts within ``k`` and the vocabulary; the run ends; once
   every sequence ended (finished, aborted, preempted on the way) a scheduler, allocator or
   drafter holds no state for any of them (:mod:`servelab.kit.conformance_state`). A scheduler
   also runs fixed scenarios with mixed SLO classes (:mod:`servelab.kit.conformance_slo_mix`), so
   an order that reads deadlines or priorities is exercised under the same contracts. An evictor
   runs behind ``allocator=paged allocator.prefix_caching=true``, every answer of its ``evict()``
   is checked before the allocator acts on it, and it also goes through its own checks
   (:mod:`servelab.kit.conformance_evictor`: scripted cache events, a fixed shared-prefix workload
   through pools from large to thrashing, every block reusable at the end).
   A router goes through synthetic clusters first, replica views the kit counts itself with no
   engine behind them (:mod:`servelab.kit.conformance_router`: mixed or prefill/decode pools of
   unequal replicas, each answer checked; the same placements again with a fresh router, and
   without the later requests; load spread over equal replicas), then through two simulated
   clusters, real engines on the simulator (``backend=sim``: 3 colocated replicas, then 2 prefill +
   2 decode; every request ends once, no block held: ``cluster run``), and last behind ``servelab
   route`` over two real tiny_code replicas (:mod:`servelab.cli.route_conformance`; skipped with
   ``real_model=False``); it has no token-equality stage.
2. **A real model** (``model=tiny``, random weights): greedy tokens equal the default stack's.

A failure prints the contract, the seed, and the smallest scenario (requests dropped one at a
time while the same contract still breaks) as overrides plus ``Request(...)`` lines.
"""

from __future__ import annotations

import argparse
import logging
import random
from dataclasses import dataclass, field, replace
from functools import lru_cache

from servelab.core.errors import ConfigError, ServelabError
from servelab.core.interfaces import LengthPredictorError, predict_checked
from servelab.core.kinds import KINDS, resolve, takes_legacy_args
from servelab.core.registry import Registry, default_registry
from servelab.core.request import Request
from servelab.kit.conformance_cases import VOCAB, Scenario, make_scenario
from servelab.kit.conformance_evictor import (LADDER_BLOCK_SIZE, SCRIPT_BLOCKS, SCRIPT_SEEDS, drain_problem,
                                              event_script, ideal_cached_tokens, ladder, ladder_requests,
                                              real_model_case, victim_problem)
from servelab.kit.kv_connector_contracts import KV_CONNECTOR_CONTRACTS
from servelab.kit.kv_tier_contracts import KV_TIER_CONTRACTS
from servelab.kit.expert_placement_contracts import EXPERT_PLACEMENT_CONTRACTS
from servelab.kit.expert_cache_contracts import EXPERT_CACHE_CONTRACTS
from servelab.kit.migration_contracts import MIGRATION_CONTRACTS
from servelab.kit.autoscaler_contracts import AUTOSCALER_CONTRACTS
from servelab.kit.conformance_router import (ROUTER_CONTRACTS, SIM_CLUSTER_REQUESTS, SIM_CLUSTERS, context_of,
                                             router_scenario, scenario_problem, spread_problem, spread_scenario)
from servelab.kit.conformance_slo_mix import SLO_MIX_SEEDS, slo_mix_scenario
from servelab.kit.conformance_starvation import promises_bound, starvation_message, starvation_scenario
from servelab.kit.conformance_state import STATE_KINDS, plugin_of, state_left_behind, state_message, state_scenario
from servelab.config import register_configs
from servelab.run.runner import run_workload

MAX_STEPS = 5_000  # per scenario: far above what any needs; reaching it is a livelock
CONTRACTS = {
    "budget": "a plan schedules at most max_num_batched_tokens tokens",
    "seats": "a plan schedules at most max_num_seqs sequences, each once",
    "blocks allocated": "every scheduled chunk has KV blocks, and starts at num_computed_tokens",
    "victim among candidates": "select_victim returns one of the candidates it was given",
    "kv integrity": "the KV cache reads back what was written (block tables, swaps, shared prefixes)",
    "every request ends": "each valid request finishes, each invalid one is rejected with a reason",
    "leaked blocks": "no block is held once every request has ended",
    "abort": "a request aborted in any state (waiting, running, swapped, mid-prefill) leaves the scheduler, "
             "frees its blocks and is recorded as aborted; the others keep their tokens",
    "outputs": "greedy tokens equal the default stack's (fcfs, paged, recompute, no drafter)",
    "drafts": "proposals hold at most k ids, all inside the vocabulary",
    "starvation bound": "a scheduler with a max_wait_s field starts every request within that bound "
                        "(plus the time a seat takes to free up)",
    "progress": f"the run ends (within {MAX_STEPS} steps; no livelock)",
    "state left behind": "once every sequence ended (finished, aborted, preempted on the way), a scheduler, "
                         "allocator or drafter keeps no per-sequence state (ids or Sequence objects) for any",
    "plugin raised": "the plugin does not raise",
    "predictions": "a length predictor answers every request with a finite number of tokens >= 0, the same "
                   "number every time it is asked about the same request",
    "live block kept": "an evictor never gives up a block that a running request still references",
    "victim is cached": "an evictor gives up a block of the prefix cache (not a free, never-cached or evicted one)",
    "victim given": "an evictor names a block whenever cached blocks are evictable (never None then)",
    "hits kept": "in a pool that holds every block, the prefix-cache hits equal the ideal's and lru's",
    "blocks reusable": "once a run ended every block is free, and a request for the whole pool gets every block "
                       "(each cached one evicted once)",
    **ROUTER_CONTRACTS,
    **KV_TIER_CONTRACTS,
    **KV_CONNECTOR_CONTRACTS,
    **EXPERT_PLACEMENT_CONTRACTS,
    **EXPERT_CACHE_CONTRACTS,
    **MIGRATION_CONTRACTS,
    **AUTOSCALER_CONTRACTS,
}
REAL_MODEL = ("model=tiny", "model.hidden_size=32", "model.intermediate_size=64", "model.num_hidden_layers=1",
              "model.num_attention_heads=2", "model.num_key_value_heads=1", "max_model_len=128")
log = logging.getLogger(__name__)


class ContractViolation(AssertionError):
    """One broken contract (``contract`` is a key of :data:`CONTRACTS`)."""

    def __init__(self, contract: str, message: str) -> None:
        super().__init__(f"{contract}: {message}")
        self.contract = contract


@dataclass
class Failure:
    contract: str
    message: str
    scenario: Scenario | None = None  # None: the real-model check

    def __str__(self) -> str:
        text = f"contract broken: {self.contract} ({CONTRACTS[self.contract]})\n  {self.message}"
        if self.scenario is not None:
            text += f"\n  reproduce: {self.scenario.describe()}\n{self.scenario.reproducer()}"
        return text


@dataclass
class Report:
    """What :func:`check_plugin` found; ``ok`` when no contract broke."""

    kind: str
    name: str
    cases: int = 0
    real_model: bool = False
    failures: list[Failure] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures

    @property
    def contracts_broken(self) -> list[str]:
        return sorted({f.contract for f in self.failures})

    def __str__(self) -> str:
        head = (f"{self.kind}={self.name}: {'PASS' if self.ok else 'FAIL'} ({self.cases} random scenarios"
                f"{', real-model check' if self.real_model else ''})")
        return "\n".join([head, *(f"note: {n}" for n in self.notes), *(str(f) for f in self.failures)])


def check_plugin(kind: str, name: str, registry: Registry | None = None, cases: int = 20, seed: int = 0,
                 real_model: bool = True, max_failures: int = 3, overrides: tuple[str, ...] = ()) -> Report:
    """Run plugin ``kind=name`` through its kind's conformance stages (``KindSpec.checks``, in
    order): ``cases`` random scenarios (seeds ``seed ..``) and, with ``real_model``, the tiny-model
    equality check, plus the stages the kind adds. ``registry``: one holding the plugin (default:
    the installed entry points). Stops after ``max_failures`` failing scenarios. ``overrides``
    (Hydra syntax, e.g. ``("length_predictor=oracle", "scheduler.max_wait_s=0.5")``) go into every
    run of the plugin and beat the scenario's own choice of the same key; the default stack the
    outputs are compared with never gets them."""
    spec = KINDS.get(kind)
    if spec is None or not spec.checks:
        raise ValueError(f"check_plugin: kind {kind!r} is not one of {', '.join(kit_kinds())}")
    registry = registry or default_registry()
    registry.get(kind, name)  # an unknown name fails here, listing the known ones
    register_configs(registry)
    report = Report(kind, name)
    extra = _companion_overrides(kind, name, registry, tuple(overrides), report.notes)
    if takes_legacy_args(spec, registry.get(kind, name)):
        report.notes.append(f"built through the adapter for 0.1 constructors: write __init__(self, config, "
                            f"context: {spec.context.__name__}) (the old shape goes in 0.2)")
    with _captured_warnings() as warnings:
        run = KitRun(report, registry, extra, cases, seed, max_failures, real_model, warnings)
        for stage in spec.checks:
            answer = (STAGES[stage] if stage in STAGES else resolve(stage))(run)
            if isinstance(answer, Failure):
                report.failures.append(answer)
            elif answer is STOP:
                break
    return report


def kit_kinds() -> list[str]:
    """The kinds ``check-plugin`` knows: those whose row in the kinds table names stages."""
    return [k.name for k in KINDS.values() if k.checks]


STOP = object()  # a stage's answer: skip the stages after it (their failures would share its cause)


@dataclass
class KitRun:
    """One ``check_plugin`` call, as its stages see it (a third-party kind's stage gets this too)."""

    report: Report
    registry: Registry
    extra: tuple[str, ...]
    cases: int
    seed: int
    max_failures: int
    real_model: bool
    warnings: list

    @property
    def kind(self) -> str:
        return self.report.kind

    @property
    def name(self) -> str:
        return self.report.name

    def fail(self, failure: Failure | None) -> bool:
        """Record ``failure`` if any; True when it was one."""
        if failure is not None:
            self.report.failures.append(failure)
        return failure is not None


def _stage_scenarios(run: KitRun):
    kind, name, report = run.kind, run.name, run.report
    cases = run.cases
    if kind == "drafter" and _needs_draft_model(run.registry.get(kind, name)):
        report.notes.append("needs a draft model: random scenarios (fake executor) skipped")
        cases = 0
    for s in range(run.seed, run.seed + cases):
        report.cases += 1
        failure = _check_scenario(with_overrides(make_scenario(s, kind, name), run.extra), run.registry, run.warnings,
                                  (kind, name))
        if failure is not None:
            report.failures.append(_shrink(failure, run.registry, run.warnings, (kind, name)))
            if len(report.failures) >= run.max_failures:
                break


def _stage_slo_mix(run: KitRun):
    """The fixed mixed-SLO scenarios (:mod:`servelab.kit.conformance_slo_mix`), the random scenarios' contracts."""
    if run.report.failures:
        return  # one root cause at a time
    for seed in SLO_MIX_SEEDS:
        scenario = with_overrides(slo_mix_scenario(seed, run.name), run.extra)
        failure = _check_scenario(scenario, run.registry, run.warnings, (run.kind, run.name))
        if failure is not None:
            failure = _shrink(failure, run.registry, run.warnings, (run.kind, run.name))
            failure.message = f"mixed SLO classes (the kit's fixed scenario {seed}): {failure.message}"
            run.report.failures.append(failure)
            return


def _stage_state(run: KitRun):
    if run.report.failures or (run.kind == "drafter" and _needs_draft_model(run.registry.get(run.kind, run.name))):
        return  # one root cause at a time
    run.fail(_check_state_scenario(run.kind, run.name, run.registry, run.extra))


def _stage_evictor_script(run: KitRun):
    run.report.notes.append("evicts behind allocator=paged allocator.prefix_caching=true")
    if run.fail(_check_event_script(run.name, run.registry, run.extra)):
        # the clearest account of a bad answer: nothing else until it passes
        run.report.notes.append("random scenarios and the real model skipped until the event script passes")
        return STOP


def _stage_evictor_ladder(run: KitRun):
    if not run.report.failures:
        run.fail(_check_ladder(run.name, run.registry, run.extra))


def _stage_starvation(run: KitRun):
    if promises_bound(run.registry.get(run.kind, run.name)):
        run.fail(_check_starvation(run.name, run.registry, run.extra))


def _stage_real_model(run: KitRun):
    if run.real_model:
        run.report.real_model = True
        run.fail(_check_real_model(run.kind, run.name, run.registry, run.extra))
    else:
        run.report.notes.append("real-model check skipped")


def _stage_predictions(run: KitRun):
    if run.registry.get(run.kind, run.name).predicts and not run.report.failures:
        run.fail(_check_predictions(run.registry, run.extra))


def _stage_router(run: KitRun):
    _check_router(run.report, run.registry, run.extra, run.cases, run.seed, run.max_failures)


#: The conformance stages a kind's ``checks`` may name; else ``"module:function"``, a function of a
#: :class:`KitRun` returning None, a :class:`Failure` (recorded) or :data:`STOP`.
STAGES = {"scenarios": _stage_scenarios, "state": _stage_state, "slo_mix": _stage_slo_mix,
          "evictor_script": _stage_evictor_script,
          "evictor_ladder": _stage_evictor_ladder, "starvation": _stage_starvation, "real_model": _stage_real_model,
          "predictions": _stage_predictions, "router": _stage_router}


def _companion_overrides(kind: str, name: str, registry: Registry, overrides: tuple[str, ...],
                         notes: list[str]) -> tuple[str, ...]:
    """The user's overrides, plus what the plugin cannot run without: a length predictor is
    exercised by ``scheduler=sjf`` (which asks it about every request), and a scheduler that needs
    predictions gets ``length_predictor=oracle`` unless one was given."""
    keys = {o.split("=", 1)[0].lstrip("+~") for o in overrides}
    extra: tuple[str, ...] = (f"{kind}={name}",) if kind == "length_predictor" else ()
    if kind == "length_predictor" and "scheduler" not in keys:
        if registry.get(kind, name).predicts:
            extra += ("scheduler=sjf",)
            notes.append("length predictor exercised by scheduler=sjf (give scheduler=... to choose another)")
        else:  # `none`: only a scheduler that tolerates no predictions can run with it
            extra += ("scheduler=mlfq", "scheduler.use_length_predictor=true")
            notes.append("predicts nothing: run with scheduler=mlfq scheduler.use_length_predictor=true, "
                         "which falls back to skip-join")
    if kind == "scheduler" and registry.get(kind, name).needs_length_predictor and "length_predictor" not in keys:
        extra += ("length_predictor=oracle",)
        notes.append(f"scheduler={name} needs predictions: length_predictor=oracle (give length_predictor=... "
                     "to choose another)")
    return extra + overrides


def with_overrides(scenario: Scenario, extra: tuple[str, ...]) -> Scenario:
    """``scenario`` with ``extra`` overrides replacing its own for the same keys."""
    return replace(scenario, overrides=merge_overrides(scenario.overrides, extra)) if extra else scenario


def merge_overrides(base: tuple[str, ...], extra: tuple[str, ...]) -> tuple[str, ...]:
    """``base`` less the keys ``extra`` sets, then ``extra`` (Hydra refuses a key given twice)."""
    keys = {o.split("=", 1)[0].lstrip("+~") for o in extra}
    return tuple(o for o in base if o.split("=", 1)[0].lstrip("+~") not in keys) + tuple(extra)


def _check_predictions(registry: Registry, extra: tuple[str, ...]) -> Failure | None:
    """The predictor answers every request of a few scenarios with a finite number >= 0, and the
    same number when asked again (a fresh instance too): predictions must not depend on call order."""
    from servelab.assemble.stack import build_stack  # noqa: PLC0415 - torch

    requests = [r for s in range(3) for r in make_scenario(s).requests if r.prompt_token_ids and r.max_tokens > 0]
    cfg = _compose(merge_overrides(("model=tiny", "max_model_len=128"), extra))
    answers = []
    for _ in range(2):
        predictor = build_stack(cfg, registry).engine.scheduler.length_predictor
        if predictor is None:
            return Failure("predictions", "the stack built no predictor (length_predictor=none?)")
        try:
            answers.append([predict_checked(predictor, r) for r in requests] + [predict_checked(predictor, requests[0])])
        except LengthPredictorError as exc:
            return Failure("predictions", str(exc))
    first, second = answers
    if first[0] != first[-1] or first != second:
        changed = next(r.id for r, a, b in zip(requests, first, second) if a != b) if first != second else requests[0].id
        return Failure("predictions", f"request {changed!r} got different predictions when asked again")
    return None


def _check_starvation(name: str, registry: Registry, extra: tuple[str, ...] = ()) -> Failure | None:
    overrides, requests = starvation_scenario()
    try:
        _, result = _run(merge_overrides((f"scheduler={name}", *overrides), extra), 4096, 0, requests, registry,
                         checked=True)
    except ContractViolation as exc:
        return Failure(exc.contract, str(exc).split(": ", 1)[1])
    message = starvation_message({r["id"]: r for r in result.requests})
    return Failure("starvation bound", message) if message else None


def _check_state_scenario(kind: str, name: str, registry: Registry, extra: tuple[str, ...] = ()) -> Failure | None:
    """The fixed run of :func:`state_scenario` (finishes, preemptions, a waiting and a running
    request aborted): afterwards the plugin holds nothing for any of its sequences."""
    overrides, num_blocks, requests, aborts = state_scenario(kind, name)
    overrides = merge_overrides(overrides, extra)

    def abort_due(engine, record) -> None:
        for rid, step in aborts.items():
            if step <= record.step and rid in engine.sequences:
                engine.abort(rid)

    try:
        stack, _ = _run(overrides, num_blocks, 0, requests, registry, checked=True, on_step=abort_due)
        _check_state(stack, (kind, name))
    except ContractViolation as exc:
        return Failure(exc.contract, f"{str(exc).split(': ', 1)[1]} (the kit's fixed run: {' '.join(overrides)}, "
                       f"{len(requests)} requests, pool of {num_blocks} blocks, {sorted(aborts)} aborted)")
    return None


# ---- routers ---------------------------------------------------------------------------------
def _check_router(report: Report, registry: Registry, extra: tuple[str, ...], cases: int, seed: int,
                  max_failures: int) -> Report:
    """A router through its stages (:mod:`servelab.kit.conformance_router`), each once the earlier
    ones passed: ``cases`` seeded synthetic clusters, then the spread over equal replicas. A router
    never changes what is computed: there is no real-model stage."""
    from omegaconf import OmegaConf  # noqa: PLC0415

    cls = registry.get("router", report.name)
    try:
        config = OmegaConf.to_object(_compose(merge_overrides(("model=tiny", f"router={report.name}"), extra)).router)
        cls(config, context_of(spread_scenario(), seed))
    except Exception as exc:  # noqa: BLE001 - e.g. its __init__ refusing its config
        report.failures.append(Failure("plugin raised", f"building router {report.name!r}: "
                                       f"{type(exc).__name__}: {exc}"))
        return report
    report.notes.append("synthetic clusters, then simulated ones; no token-equality stage: a router never changes "
                        "the tokens")
    make = lambda context: cls(config, context)  # noqa: E731 - a fresh router per run
    for stage in (_router_scenario_checks, _router_spread_check):
        if report.failures:
            break
        stage(report, make, cases, seed, max_failures)
    if not report.failures:
        _router_cluster_check(report, registry, extra, seed)
    return report


def _router_cluster_check(report: Report, registry: Registry, extra: tuple[str, ...], seed: int) -> None:
    """The router in the simulator's cluster loop: 3 colocated replicas, then 2 prefill + 2 decode;
    every request must end exactly once and every pool end empty."""
    from servelab.cluster.build import build_cluster  # noqa: PLC0415 - torch

    n = SIM_CLUSTER_REQUESTS
    for shape in SIM_CLUSTERS:
        cfg = _compose(merge_overrides(("backend=sim", "model=llama3_8b", "hardware=h100", f"workload.num_requests={n}",
                                        "workload.rate=50", f"seed={seed}", f"router={report.name}", *shape), extra))
        where = f"a simulated cluster ({' '.join(shape)}, {n} requests)"
        try:
            cluster, stacks = build_cluster(cfg, registry=registry)
        except Exception as exc:  # noqa: BLE001 - e.g. its __init__ refusing its config
            report.failures.append(Failure("plugin raised", f"building {where}: {type(exc).__name__}: {exc}"))
            return
        ended: list[str] = []
        cluster.request_listeners.append(lambda seq: ended.append(seq.id))
        try:
            cluster.run(_sim_requests(cfg))
        except Exception as exc:  # noqa: BLE001 - a RouterError names the request
            report.failures.append(Failure("placed once", f"{where}: {type(exc).__name__}: {exc}"))
            return
        finally:
            for stack in stacks:
                stack.executor.shutdown()
        leaked = sum(r.engine.allocator.leaked_blocks() for r in cluster.replicas)
        twice = sorted({i for i in ended if ended.count(i) > 1})
        if len(ended) != n or twice or leaked:
            report.failures.append(Failure("cluster run", f"{where}: {len(ended)} requests ended (duplicates: "
                                           f"{twice[:3]}), {leaked} KV blocks still held at the end"))
            return


def _sim_requests(cfg):
    from servelab.assemble.block_size import workload_requests  # noqa: PLC0415 - torch
    from servelab.assemble.executor import model_shape  # noqa: PLC0415 - torch

    return workload_requests(cfg, model_shape(cfg))


def _router_scenario_checks(report: Report, make, cases: int, seed: int, max_failures: int) -> None:
    for s in range(seed, seed + cases):
        report.cases += 1
        problem = scenario_problem(make, router_scenario(s))
        if problem is not None:
            report.failures.append(Failure(*problem))
            if len(report.failures) >= max_failures:
                return


def _router_spread_check(report: Report, make, cases: int, seed: int, max_failures: int) -> None:
    problem = spread_problem(make)
    if problem is not None:
        report.failures.append(Failure(*problem))


def _check_event_script(name: str, registry: Registry, extra: tuple[str, ...]) -> Failure | None:
    """The evictor alone, fresh for each seed, through :func:`event_script`'s cache events."""
    from servelab.kit.testing import KVCheckingExecutor, VirtualClock  # noqa: PLC0415 - torch
    from servelab.assemble.stack import build_stack  # noqa: PLC0415 - torch

    cfg = _compose(merge_overrides(("model=tiny", "allocator=paged", "allocator.prefix_caching=true", f"evictor={name}"),
                                   extra))
    for seed in SCRIPT_SEEDS:
        clock = VirtualClock()
        try:
            stack = build_stack(cfg, registry, executor=KVCheckingExecutor(clock, SCRIPT_BLOCKS, cfg.block_size,
                                                                           vocab_size=VOCAB), clock=clock)
        except Exception as exc:  # noqa: BLE001 - e.g. its __init__ refusing its config
            return Failure("plugin raised", f"building evictor {name!r}: {type(exc).__name__}: {exc}")
        problem = event_script(stack.engine.allocator.evictor, seed, SCRIPT_BLOCKS)
        if problem is not None:
            return Failure(problem[0], f"evictor plugin {name!r}: {problem[1]}")
    return None


def _check_ladder(name: str, registry: Registry, extra: tuple[str, ...]) -> Failure | None:
    """:func:`ladder_requests` through each pool of :func:`ladder` (lru too in the large ones):
    tokens equal the default stack's, every request ends, nothing leaks, every block is reusable, and
    where the pool holds every block the hits equal lru's and, one request at a time, the ideal's."""
    requests = ladder_requests()
    expected = _reference(64, requests)
    ideal = ideal_cached_tokens(requests, LADDER_BLOCK_SIZE)
    lru_extra = tuple(o for o in extra if not o.lstrip("+~").startswith("evictor"))
    for label, overrides, num_blocks in ladder():
        where = (f"(the kit's fixed shared-prefix run, {label}: {' '.join(overrides)}, {len(requests)} requests, "
                 f"pool of {num_blocks} blocks)")
        hits = {}
        for evictor in (name, "lru") if label.startswith("large") else (name,):
            run_overrides = merge_overrides((*overrides, f"evictor={evictor}"), extra if evictor == name else lru_extra)
            try:
                stack, result = _run(run_overrides, num_blocks, 0, requests, registry, checked=True)
                for rec in result.requests:
                    if rec["finish_reason"] != "length":
                        raise ContractViolation("every request ends", f"{rec['id']} ended {rec['finish_reason']}: "
                                                f"{rec['rejected_reason']}")
                    if rec["output_token_ids"] != expected[rec["id"]]:
                        raise ContractViolation("outputs", f"{rec['id']}: {rec['output_token_ids']} != "
                                                f"{expected[rec['id']]} (the default stack's)")
                if result.summary["leaked_blocks"]:
                    raise ContractViolation("leaked blocks", f"{result.summary['leaked_blocks']} blocks still held")
                _check_drain(stack)
            except ContractViolation as exc:
                who = "" if evictor == name else f"evictor={evictor} (the run compared with): "
                return Failure(exc.contract, f"{who}{str(exc).split(': ', 1)[1]} {where}")
            hits[evictor] = sum(rec["num_cached_prompt_tokens"] for rec in result.requests)
        if label.startswith("large") and hits[name] != hits["lru"]:
            return Failure("hits kept", f"{hits[name]} prompt tokens came from the cache, lru's {hits['lru']} {where}")
        if "one request at a time" in label and hits[name] != ideal:
            return Failure("hits kept", f"{hits[name]} prompt tokens came from the cache; an unbounded cache "
                           f"keeping every earlier prompt serves {ideal} {where}")
    return None


def _check_drain(stack) -> None:
    """Every block of a paged allocator is reusable once its run ended (:func:`drain_problem`)."""
    allocator = stack.engine.allocator
    if not hasattr(allocator, "evictable"):  # an evictor put behind another allocator: nothing to drain
        return
    try:
        problem = drain_problem(allocator)
    except Exception as exc:  # the guard's ContractViolation, or the evictor raising
        raise _as_violation(exc) from exc
    if problem:
        raise ContractViolation("blocks reusable", problem)


def _needs_draft_model(drafter_cls) -> bool:
    try:
        return drafter_cls.model_path(drafter_cls.Config(), None) is not None
    except ServelabError:  # e.g. "needs drafter.path"
        return True


# ---- one scenario ---------------------------------------------------------------------------
def _check_scenario(scenario: Scenario, registry: Registry, warnings: list[str],
                    plugin: tuple[str, str] | None = None) -> Failure | None:
    try:
        _check_outcome(scenario, registry, warnings, plugin)
    except ContractViolation as exc:
        return Failure(exc.contract, str(exc).split(": ", 1)[1], scenario)
    return None


def _check_outcome(scenario: Scenario, registry: Registry, warnings: list[str],
                   plugin: tuple[str, str] | None = None) -> None:
    del warnings[:]
    stack, result = _run(scenario.overrides, scenario.num_blocks, scenario.num_swap_blocks, scenario.requests,
                         registry, checked=True)
    drafter_warnings = [w for w in warnings if w.startswith("drafter")]
    if drafter_warnings:
        raise ContractViolation("drafts", drafter_warnings[0])
    allocator = stack.engine.allocator
    records = {r["id"]: r for r in result.requests}
    valid = [r for r in scenario.requests if r.id not in scenario.invalid]
    expected = _reference(scenario.max_model_len, valid)
    for req in scenario.requests:
        rec = records[req.id]
        reason = rec["rejected_reason"]
        if req.id in scenario.invalid:
            if not reason:
                raise ContractViolation("every request ends", f"{req.id} ({scenario.invalid[req.id]}) was not "
                                        f"rejected: finish_reason={rec['finish_reason']}")
        elif reason is not None:
            needed = min(req.prompt_len + req.max_tokens, scenario.max_model_len)
            if allocator.can_ever_fit(needed):
                raise ContractViolation("every request ends", f"valid {req.id} rejected: {reason}")
        elif rec["finish_reason"] != "length":
            raise ContractViolation("every request ends", f"{req.id} did not finish: {rec['finish_reason']}")
        elif rec["output_token_ids"] != expected[req.id]:
            raise ContractViolation("outputs", f"{req.id}: {rec['output_token_ids']} != {expected[req.id]} "
                                    "(the default stack's)")
    leaked = result.summary["leaked_blocks"]
    if leaked:
        raise ContractViolation("leaked blocks", f"{leaked} blocks still held after every request ended")
    if plugin is not None and plugin[0] == "evictor":
        _check_drain(stack)
    _check_state(stack, plugin)
    _check_aborts(scenario, registry, expected, plugin)


def _check_state(stack, plugin: tuple[str, str] | None) -> None:
    """The plugin under test keeps nothing for the sequences of a run that has ended."""
    if plugin is None or plugin[0] not in STATE_KINDS:
        return
    kind, name = plugin
    instance = plugin_of(stack.engine, kind)
    ended = {seq.id for seq in stack.engine.sequences.values() if seq.is_finished}
    where = state_left_behind(instance, ended) if instance is not None else None
    if where is not None:
        raise ContractViolation("state left behind", state_message(kind, name, where, len(ended)))


def _check_aborts(scenario: Scenario, registry: Registry, expected: dict[str, list[int]],
                  plugin: tuple[str, str] | None = None) -> None:
    """The scenario again, aborting a seeded third of its requests at seeded steps (a server's
    client disconnecting): each aborted one ends as such, no block leaks, the others' tokens hold."""
    rng = random.Random(scenario.seed)
    plan = {r.id: rng.randint(0, 12) for r in scenario.requests if rng.random() < 0.35}
    if not plan:
        return

    def abort_due(engine, record) -> None:
        for rid, step in plan.items():
            if step <= record.step and rid in engine.sequences:
                engine.abort(rid)

    stack, result = _run(scenario.overrides, scenario.num_blocks, scenario.num_swap_blocks, scenario.requests,
                         registry, checked=True, on_step=abort_due)
    for rec in result.requests:
        rid, reason = rec["id"], rec["finish_reason"]
        if rec["rejected_reason"] is not None:
            continue
        if reason == "abort":
            if rid not in plan:
                raise ContractViolation("abort", f"{rid} was never aborted but ended with finish_reason=abort")
        elif reason != "length":
            raise ContractViolation("abort", f"{rid} did not end (finish_reason={reason}) in a run with aborts")
        elif rid in expected and rec["output_token_ids"] != expected[rid]:
            raise ContractViolation("abort", f"{rid}: {rec['output_token_ids']} != {expected[rid]} once "
                                    f"{sorted(plan)} were aborted")
    if stack.engine.scheduler.num_unfinished():
        raise ContractViolation("abort", f"the scheduler still holds {stack.engine.scheduler.num_unfinished()} "
                                "sequences once every request ended or was aborted")
    leaked = result.summary["leaked_blocks"]
    if leaked:
        raise ContractViolation("abort", f"{leaked} blocks still held after aborting {sorted(plan)}")
    _check_state(stack, plugin)


def _reference(max_model_len: int, valid: list) -> dict[str, list[int]]:
    """Outputs of the default stack (fcfs, paged, recompute, whole prompts) with room for everything."""
    overrides = (f"max_model_len={max_model_len}", "block_size=16", f"max_num_batched_tokens={max_model_len}")
    _, result = _run(overrides, 64 * max(1, len(valid)), 0, valid, default_registry(), checked=False)
    return {r["id"]: r["output_token_ids"] for r in result.requests}


# Scalar keys the random scenarios vary: set on a composed config of the rest rather than composed
# afresh (a Hydra compose costs ~0.5 s of CPU; the plugin choices repeat across scenarios, these don't).
SCALAR_KEYS = frozenset(("block_size", "chunked_prefill", "max_model_len", "max_num_seqs", "max_num_batched_tokens",
                         "allocator.prefix_caching", "slo.ttft_ms"))


@lru_cache(maxsize=1024)
def _compose(overrides: tuple[str, ...]):
    """The config ``run.py <overrides> workload=synthetic`` composes (logger off); the kit's
    :data:`SCALAR_KEYS` are set on a cached composition of the other overrides."""
    import yaml  # noqa: PLC0415
    from omegaconf import OmegaConf  # noqa: PLC0415

    scalar = [o for o in overrides if o.split("=", 1)[0] in SCALAR_KEYS]
    if not scalar:
        return _hydra_compose(overrides)
    cfg = _hydra_compose(tuple(o for o in overrides if o not in scalar)).copy()
    for o in scalar:
        key, value = o.split("=", 1)
        OmegaConf.update(cfg, key, yaml.safe_load(value), merge=False)
    return cfg


@lru_cache(maxsize=256)
def _hydra_compose(overrides: tuple[str, ...]):
    from servelab.api import compose  # noqa: PLC0415 - torch

    return compose([*overrides, "workload=synthetic"], logger="none", progress=False)


def _run(overrides, num_blocks: int, num_swap_blocks: int, requests, registry: Registry, checked: bool,
         on_step=None):
    from servelab.kit.testing import KVCheckingExecutor, VirtualClock  # noqa: PLC0415 - torch
    from servelab.run.session import collect_results  # noqa: PLC0415 - torch
    from servelab.assemble.stack import build_stack  # noqa: PLC0415 - torch

    cfg = _compose(merge_overrides(("model=tiny",), tuple(overrides)))
    clock = VirtualClock()
    executor = KVCheckingExecutor(clock, num_blocks, cfg.block_size, vocab_size=VOCAB,
                                  num_swap_blocks=num_swap_blocks, max_positions=cfg.max_model_len)
    stack = build_stack(cfg, registry, executor=executor, clock=clock)
    if checked:
        _guard(stack)
    stack.engine.keep_steps = False
    if on_step is not None:  # after each step's tokens are applied: the engine is between steps
        stack.engine.step_listeners.append(lambda record: on_step(stack.engine, record))
    try:
        run_workload(stack.engine, requests, sleep=clock.sleep)
    except Exception as exc:  # every way a run breaks is named as a contract
        raise _as_violation(exc) from exc
    return stack, collect_results(stack.engine, 1.0)


def _as_violation(exc: Exception) -> ContractViolation:
    # a guard's violation may come wrapped twice (an evictor's, by the allocator and the engine)
    cause: BaseException | None = exc
    while cause is not None and not isinstance(cause, ContractViolation):
        cause = cause.__cause__
    if isinstance(cause, ContractViolation):  # (else None)
        return cause
    if isinstance(exc, AssertionError):  # the KV-checking executor
        return ContractViolation("kv integrity", str(exc))
    if "still holds aborted request" in str(exc):  # the engine's check after Scheduler.abort
        return ContractViolation("abort", str(exc))
    if isinstance(exc, RuntimeError) and "made no progress" in str(exc):
        return ContractViolation("progress", str(exc))
    return ContractViolation("plugin raised", f"{type(exc).__name__}: {exc}")


def _guard(stack) -> None:
    """Check every plan and every victim choice as the run goes (instance-level wrappers)."""
    engine, limits = stack.engine, stack.limits
    scheduler, allocator, preemption = engine.scheduler, engine.allocator, engine.scheduler.preemption
    schedule, select_victim = scheduler.schedule, preemption.select_victim

    def checked_schedule(now):
        plan = schedule(now)
        _check_plan(plan, limits, allocator, engine.totals.num_steps)
        return plan

    def checked_select_victim(candidates):
        victim = select_victim(candidates)
        if not any(victim is c for c in candidates):
            raise ContractViolation("victim among candidates", f"select_victim returned {getattr(victim, 'id', victim)!r}, "
                                    f"not one of {[c.id for c in candidates]}")
        return victim

    def cap(record):
        if record.step >= MAX_STEPS:
            raise ContractViolation("progress", f"no end after {MAX_STEPS} steps: queues {record.queues}")

    scheduler.schedule, preemption.select_victim = checked_schedule, checked_select_victim
    engine.step_listeners.append(cap)
    if hasattr(allocator, "evictable") and allocator.evictor is not None:
        _guard_evictions(allocator, engine)


def _guard_evictions(allocator, engine) -> None:
    """Check every answer of the evictor's ``evict()`` before the paged allocator acts on it (an
    instance-level wrapper; the allocator reports what it raises naming the evictor, and
    :func:`_as_violation` finds the named contract inside)."""
    evictor = allocator.evictor
    evict = evictor.evict

    def checked_evict():
        answer = evict()
        problem = victim_problem(answer, allocator)
        if problem is not None:
            raise ContractViolation(problem[0], f"evictor plugin {type(evictor).name!r}: {problem[1]} "
                                    f"(step {engine.totals.num_steps})")
        return answer

    try:
        evictor.evict = checked_evict
    except AttributeError:  # __slots__ without __dict__: the allocator's own check still stops the run
        pass


def _check_plan(plan, limits, allocator, step: int) -> None:
    where = f"step {step}"
    tokens = plan.num_batched_tokens
    if tokens > limits.max_num_batched_tokens:
        raise ContractViolation("budget", f"{where}: {tokens} tokens > max_num_batched_tokens="
                                f"{limits.max_num_batched_tokens}")
    ids = [e.seq.id for e in plan.scheduled]
    if len(ids) > limits.max_num_seqs or len(set(ids)) < len(ids):
        raise ContractViolation("seats", f"{where}: {len(ids)} entries ({len(set(ids))} sequences) for "
                                f"max_num_seqs={limits.max_num_seqs}")
    for e in plan.scheduled:
        if e.start != e.seq.num_computed_tokens or e.num_tokens < 1:
            raise ContractViolation("blocks allocated", f"{where}: {e.seq.id} chunk of {e.num_tokens} at {e.start}, "
                                    f"but {e.seq.num_computed_tokens} tokens are computed")
        slots = len(allocator.block_table(e.seq.id)) * limits.block_size
        if slots < e.start + e.num_tokens:
            raise ContractViolation("blocks allocated", f"{where}: {e.seq.id} computes tokens up to "
                                    f"{e.start + e.num_tokens} but holds {slots} KV slots")


def _shrink(failure: Failure, registry: Registry, warnings: list[str],
            plugin: tuple[str, str] | None = None) -> Failure:
    """Drop requests one at a time while the same contract still breaks: the smallest scenario."""
    assert failure.scenario is not None  # a scenario's failure (not the real model's)
    for req in list(failure.scenario.requests):
        assert failure.scenario is not None  # (so is each smaller one)
        if len(failure.scenario.requests) == 1:
            break
        smaller = _check_scenario(failure.scenario.without(req.id), registry, warnings, plugin)
        if smaller is not None and smaller.contract == failure.contract:
            failure = smaller
    return failure


# ---- the real model -------------------------------------------------------------------------
def _check_real_model(kind: str, name: str, registry: Registry, extra: tuple[str, ...] = ()) -> Failure | None:
    """Greedy tokens of a few requests on the tiny random model equal the default stack's."""
    from servelab.assemble.stack import build_stack  # noqa: PLC0415 - torch

    requests = [Request(f"m{i}", tuple((7 * i + 3 * j) % 300 + 1 for j in range(5 + 9 * i)), 6 + i,
                        arrival_time=0.0) for i in range(4)]
    outputs = {}
    plugin_stack = merge_overrides((f"{kind}={name}", "num_kv_blocks=40", "block_size=4", "max_num_batched_tokens=32",
                                    "max_num_seqs=3"), extra)
    if kind == "evictor":  # shared prefixes through a pool that evicts
        overrides, requests = real_model_case()
        plugin_stack = merge_overrides((f"{kind}={name}", *overrides), extra)
    # a model override (model=tiny_code for a predictor trained for it) replaces the random tiny shape
    model = REAL_MODEL if not any(o.startswith("model=") for o in extra) else REAL_MODEL[-1:]
    for label, overrides in (("default", ()), ("plugin", plugin_stack)):
        try:
            cfg = _compose(merge_overrides(model, overrides))
            engine = build_stack(cfg, registry).engine
            run_workload(engine, requests)
        except Exception as exc:  # noqa: BLE001
            return Failure("plugin raised", f"real model ({label} stack {' '.join(overrides)}): "
                           f"{type(exc).__name__}: {exc}")
        outputs[label] = {s.id: list(s.output_token_ids) for s in engine.sequences.values()}
        if label == "plugin" and engine.allocator.leaked_blocks():
            return Failure("leaked blocks", f"real model: {engine.allocator.leaked_blocks()} blocks held at the end")
    for rid, tokens in outputs["default"].items():
        if outputs["plugin"].get(rid) != tokens:
            return Failure("outputs", f"real model (model=tiny, greedy), {rid}: {outputs['plugin'].get(rid)} != "
                           f"{tokens} (the default stack's)")
    return None


class _ListHandler(logging.Handler):
    """Appends each record's message to ``messages``."""

    def __init__(self, messages: list[str], level: int) -> None:
        super().__init__(level)
        self.messages = messages

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


class _captured_warnings:
    """Collect servelab's warnings (drafter faults) instead of printing them (fallbacks are expected)."""

    def __enter__(self) -> list[str]:
        self.logger = logging.getLogger("servelab")
        self.messages: list[str] = []
        self.handler = _ListHandler(self.messages, logging.WARNING)
        # the 0.1-constructor adapter's warning is a note of the report, not a fault of the run
        self.handler.addFilter(lambda record: record.name != "servelab.core.kinds")
        self.propagate, self.logger.propagate = self.logger.propagate, False
        self.logger.addHandler(self.handler)
        return self.messages

    def __exit__(self, *exc) -> None:
        self.logger.removeHandler(self.handler)
        self.logger.propagate = self.propagate


# ---- the command line -----------------------------------------------------------------------
def main(argv: list[str]) -> int:
    """``servelab check-plugin <kind>=<name> [overrides ...] [--cases N] [--seed S] [--no-real-model]``."""
    parser = argparse.ArgumentParser(prog="servelab check-plugin",
                                     description="Run a plugin through servelab's conformance kit.")
    parser.add_argument("plugin", help=f"<kind>=<name>, kind one of {', '.join(kit_kinds())}")
    parser.add_argument("overrides", nargs="*", help="Hydra overrides for every run of the plugin, e.g. "
                        "length_predictor=oracle scheduler.max_wait_s=0.5")
    parser.add_argument("--cases", type=int, default=50, help="random scenarios (default 50)")
    parser.add_argument("--seed", type=int, default=0, help="first scenario seed (default 0)")
    parser.add_argument("--no-real-model", action="store_true", help="skip the tiny-model equality check (a router: the run "
                        "behind servelab route)")
    args = parser.parse_intermixed_args(argv)  # options may come between the overrides
    kind, sep, name = args.plugin.partition("=")
    if not sep or kind not in kit_kinds() or not name:
        parser.error(f"expected <kind>=<name> with kind one of {', '.join(kit_kinds())}, got {args.plugin!r}")
    bad = [o for o in args.overrides if "=" not in o]
    if bad:
        parser.error(f"expected overrides as key=value, got {bad[0]!r}")
    if args.cases < 1:  # a PASS must have tested something
        raise ConfigError(f"--cases {args.cases}: give at least 1 random scenario (default 50)")
    report = check_plugin(kind, name, cases=args.cases, seed=args.seed, real_model=not args.no_real_model,
                          overrides=tuple(args.overrides))
    print(report)
    return 0 if report.ok else 1
