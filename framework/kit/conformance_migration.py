"""The conformance kit's migration policy checks (``servelab check-plugin migration_policy=<name>``).

A migration policy chooses which running requests move; the cluster moves them
(:mod:`servelab.cluster.migration`). A move never changes what is computed, so the policy runs in
simulated clusters (``backend=sim``: :data:`CASES`, 3 colocated replicas with small KV pools, a
heavy-tailed workload behind ``router=round_robin`` so loads drift apart, and the same with replica 0
draining from :data:`DRAIN_FROM_S`) and each run is compared with the same cluster without migration.
:func:`cluster_problem` checks one cluster run against :data:`MIGRATION_CONTRACTS`, whatever moves
the requests (the tests hand it a mechanism that loses or duplicates one, and it must say so):

- "valid decisions": every answer checked as the cluster checks it (:func:`checked_decisions`);
- "tokens equal": each request's output tokens and finish reason equal the run without migration;
- "none lost or twice": every request ends exactly once; no KV block held at the end;
- "one replica": after every step of every replica, no request is live on two replicas, and one
  live on none is a migration's last copy on the link;
- "deterministic": the run again gives the same migrations and token times.

A policy that never moves (``moves_requests = False``, as ``none``) runs the first case only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from servelab.core.autoscaler import AutoscalerError
from servelab.core.migration_policy import MigrationPolicyError
from servelab.kit.migration_contracts import MIGRATION_CONTRACTS
from servelab.kit.stage_info import StageInfo

if TYPE_CHECKING:
    from servelab.cluster.simulated import Cluster
    from servelab.kit.conformance import Failure, KitRun

NUM_REQUESTS, DRAIN_FROM_S = 48, 0.5
BASE = ("backend=sim", "model=llama3_8b", "hardware=h100", "cluster.replicas=3", "num_kv_blocks=160",
        "block_size=16", "router=round_robin", f"workload.num_requests={NUM_REQUESTS}", "workload.rate=16",
        "workload.output_len.dist=lognormal", "workload.output_len.sigma=1.5", "workload.output_len.max=2000",
        "cluster.migration_interval_s=0.25", "logger=none", "progress=false")
#: the clusters a policy runs in: (label, overrides beside BASE)
CASES = (("3 replicas, heavy-tailed outputs", ()),
         ("3 replicas, replica 0 draining", ("cluster.draining=[0]", f"cluster.drain_from_s={DRAIN_FROM_S}")))
assert set(MIGRATION_CONTRACTS)  # the names below are its keys
Problem = tuple[str, str]
Outcome = tuple[dict[str, tuple], list[tuple], list[tuple]]  # outputs, migrations, token times


def outcome_of(cluster: "Cluster", requests) -> tuple[Outcome | None, Problem | None]:
    """Run ``requests`` through ``cluster``, checking "one replica" after every step; what it gave."""
    ended: list = []
    cluster.request_listeners.append(ended.append)
    broken: list[Problem] = []

    def check(record) -> None:
        if not broken:
            problem = one_replica_problem(cluster)
            if problem is not None:
                broken.append(problem)

    check.reads_step_details = False  # type: ignore[attr-defined]
    for r in cluster.replicas:
        r.engine.step_listeners.append(check)
    try:
        cluster.run(requests)
    except MigrationPolicyError as exc:
        return None, ("valid decisions", str(exc))
    except AutoscalerError as exc:  # the same runs check an autoscaler (servelab.kit.conformance_autoscaler)
        return None, ("valid scaling", str(exc))
    except Exception as exc:  # noqa: BLE001 - whatever the run raised is the finding
        return None, ("none lost or twice", f"the run raised {type(exc).__name__}: {exc}")
    if broken:
        return None, broken[0]
    ids = [s.id for s in ended]
    twice = sorted({i for i in ids if ids.count(i) > 1})
    lost = sorted({r.id for r in requests} - set(ids))
    leaked = sum(r.engine.allocator.leaked_blocks() for r in cluster.replicas)
    if twice or lost or leaked:
        return None, ("none lost or twice", f"ended twice: {twice[:3]}, never ended: {lost[:3]}, "
                      f"{leaked} KV blocks held at the end")
    driver = cluster.migration
    moves = [(m.request_id, m.source, m.target, m.start_s, m.land_s) for m in driver.sums.done] if driver else []
    outputs = {s.id: (tuple(s.output_token_ids), s.finish_reason) for s in ended}
    return (outputs, moves, sorted((s.id, tuple(s.token_times)) for s in ended)), None


def one_replica_problem(cluster: "Cluster") -> Problem | None:
    """A request live on two replicas, or on none while no migration has its last copy on the link."""
    where: dict[str, list[int]] = {}
    for r in cluster.replicas:
        for seq in r.engine.sequences.values():
            if not seq.is_finished:
                where.setdefault(seq.id, []).append(r.index)
    twice = {rid: on for rid, on in where.items() if len(on) > 1}
    if twice:
        rid, on = next(iter(twice.items()))
        return "one replica", f"request {rid!r} is live on replicas {on} at once"
    in_flight = {s.id for s in cluster.migration.in_flight()} if cluster.migration is not None else set()
    for rid, placement in cluster.protocol.placements.items():
        if rid not in where and rid not in in_flight and placement.phase == "mixed":
            return "one replica", f"request {rid!r} is placed on replica {placement.replica} and live on none"
    return None


def cluster_problem(make: Callable[[], "Cluster"], requests, reference: dict[str, tuple],
                    label: str) -> tuple[Problem | None, int]:
    """The contracts on a cluster ``make`` builds, run twice, against ``reference`` (the outputs of
    the run without migration); ``label`` names the case. Also: how many migrations it made."""
    first, problem = outcome_of(make(), requests)
    second = None
    if problem is None:
        second, problem = outcome_of(make(), requests)
    if problem is not None:
        return (problem[0], f"{label}: {problem[1]}"), 0
    assert first is not None and second is not None
    outputs, moves, times = first
    for rid, expected in reference.items():
        got = outputs.get(rid)
        if got != expected:
            return ("tokens equal", f"{label}: request {rid!r} ended with {len(got[0]) if got else 0} tokens "
                                    f"({got[1] if got else None}), {len(expected[0])} ({expected[1]}) without "
                                    "migration"), len(moves)
    if second[1:] != (moves, times):
        return ("deterministic", f"{label}: a second run moved {len(second[1])} requests, the first "
                                 f"{len(moves)}, or their tokens came at other times"), len(moves)
    return None, len(moves)


def check_migration_policy(run: "KitRun") -> "Failure | None":
    """The stage (see the module's docstring)."""
    from servelab.cluster.build import build_cluster  # noqa: PLC0415 - torch
    from servelab.kit.conformance import Failure, _compose, _sim_requests, merge_overrides  # noqa: PLC0415

    moved = 0
    cases = CASES if run.registry.get("migration_policy", run.name).moves_requests else CASES[:1]
    for label, shape in cases:
        base = (*BASE, f"seed={run.seed}")
        cfg = _compose(merge_overrides((*base, *shape, f"migration_policy={run.name}"), run.extra))
        requests = _sim_requests(cfg)
        reference, problem = outcome_of(build_cluster(_compose(base), registry=run.registry)[0], requests)
        if reference is None:
            return Failure(*(problem or ("none lost or twice", f"{label}: the run without migration failed")))

        def make(cfg=cfg) -> "Cluster":
            return build_cluster(cfg, registry=run.registry)[0]

        try:
            make()
        except Exception as exc:  # noqa: BLE001 - e.g. its __init__ refusing its config
            return Failure("plugin raised", f"building {label}: {type(exc).__name__}: {exc}")
        problem, moves = cluster_problem(make, requests, reference[0], f"{label} ({NUM_REQUESTS} requests)")
        if problem is not None:
            return Failure(*problem)
        moved += moves
    run.report.cases = len(cases)
    run.report.notes.append(f"{moved} migrations in {len(cases)} simulated clusters" +
                            ("" if moved else ": this policy moved nothing, so no move was checked"))
    return None


check_migration_policy.stage_info = StageInfo(  # type: ignore[attr-defined]
    "simulated clusters", f"{len(CASES)}, each twice and once without migration", False,
    f"{NUM_REQUESTS} heavy-tailed requests on 3 replicas with small KV pools behind round_robin, then with replica "
    f"0 draining from {DRAIN_FROM_S} s: every decision valid, tokens equal `migration_policy=none`'s, every request "
    "ends once, no block held, a request live on one replica at every step, the same migrations again")

