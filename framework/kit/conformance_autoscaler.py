"""The conformance kit's autoscaler checks (``servelab check-plugin autoscaler=<name>``).

An autoscaler decides when a simulated cluster starts and retires replicas; the cluster carries the
decisions out (:mod:`servelab.cluster.autoscale`). Scaling never changes what is computed, so the
autoscaler runs in simulated clusters (``backend=sim``: :data:`CASES`, one replica that may grow to
:data:`MAX_REPLICAS` with small KV pools under a heavy-tailed load it cannot hold alone; then the same
with ``migration_policy=drain`` emptying the replicas it retires) and each run is compared with one
replica without autoscaling. The migration kit's run (:func:`servelab.kit.conformance_migration.outcome_of`)
checks "valid scaling", "none lost or twice" and "one replica"; here also:

- "tokens equal": each request's output tokens and finish reason equal the run without autoscaling;
- "within bounds": after every question the replicas serving, starting and holding GPUs stay within
  ``cluster.min_replicas`` / ``max_replicas`` (:func:`bounds_problem`);
- "deterministic": the run again gives the same scaling, migrations and token times.

An autoscaler that never scales (``scales = False``, as ``none``) runs the first case only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from servelab.kit.autoscaler_contracts import AUTOSCALER_CONTRACTS
from servelab.kit.conformance_migration import outcome_of
from servelab.kit.stage_info import StageInfo

if TYPE_CHECKING:
    from servelab.cluster.autoscale import AutoscaleDriver
    from servelab.kit.conformance import Failure, KitRun

NUM_REQUESTS, MIN_REPLICAS, MAX_REPLICAS = 64, 1, 3
BASE = ("backend=sim", "model=llama3_8b", "hardware=h100", "cluster.replicas=1", "num_kv_blocks=160",
        "block_size=16", "router=least_outstanding", f"workload.num_requests={NUM_REQUESTS}", "workload.rate=16",
        "workload.output_len.dist=lognormal", "workload.output_len.sigma=1.5", "workload.output_len.max=2000",
        "logger=none", "progress=false")
SCALING = (f"cluster.min_replicas={MIN_REPLICAS}", f"cluster.max_replicas={MAX_REPLICAS}",
           "cluster.autoscale_interval_s=0.5", "cluster.migration_interval_s=0.25")
#: the clusters an autoscaler runs in: (label, overrides beside BASE and SCALING)
CASES = (("1 to 3 replicas, heavy-tailed outputs", ()),
         ("1 to 3 replicas, retired replicas drained by migration", ("migration_policy=drain",)))
assert {"valid scaling", "within bounds"} <= set(AUTOSCALER_CONTRACTS)


def bounds_problem(driver: "AutoscaleDriver") -> str | None:
    """The first question after which the cluster was outside its bounds, said in one line."""
    s = driver.settings
    for t, serving, starting, held in driver.history:
        if serving + starting < s.min_replicas or serving < 1 or held > s.max_replicas:
            return (f"at t={t:g}: {serving} serving, {starting} starting, {held} holding GPUs "
                    f"(min_replicas={s.min_replicas}, max_replicas={s.max_replicas})")
    return None


def check_autoscaler(run: "KitRun") -> "Failure | None":
    """The stage (see the module's docstring)."""
    from servelab.cluster.build import build_cluster  # noqa: PLC0415 - torch
    from servelab.kit.conformance import Failure, _compose, _sim_requests, merge_overrides  # noqa: PLC0415

    events = 0
    cases = CASES if run.registry.get("autoscaler", run.name).scales else CASES[:1]
    base = (*BASE, f"seed={run.seed}")
    for label, shape in cases:
        cfg = _compose(merge_overrides((*base, *SCALING, *shape, f"autoscaler={run.name}"), run.extra))
        requests = _sim_requests(cfg)
        where = f"{label} ({NUM_REQUESTS} requests)"
        reference, problem = outcome_of(build_cluster(_compose(base), registry=run.registry)[0], requests)
        if reference is None:
            return Failure(*(problem or ("none lost or twice", f"{where}: the run without autoscaling failed")))
        try:
            clusters = [build_cluster(cfg, registry=run.registry)[0] for _ in range(2)]
        except Exception as exc:  # noqa: BLE001 - e.g. its __init__ refusing its config
            return Failure("plugin raised", f"building {label}: {type(exc).__name__}: {exc}")
        seen = []
        for cluster in clusters:
            outcome, problem = outcome_of(cluster, requests)
            if problem is not None:
                return Failure(problem[0], f"{where}: {problem[1]}")
            assert outcome is not None
            driver = cluster.autoscale
            if driver is not None:
                bad = bounds_problem(driver)
                if bad is not None:
                    return Failure("within bounds", f"{where}: {bad}")
            for rid, expected in reference[0].items():
                got = outcome[0].get(rid)
                if got != expected:
                    return Failure("tokens equal", f"{where}: request {rid!r} ended with "
                                   f"{len(got[0]) if got else 0} tokens ({got[1] if got else None}), "
                                   f"{len(expected[0])} ({expected[1]}) without autoscaling")
            seen.append((outcome, list(driver.history) if driver else [],
                         (driver.sums.scale_up_events, driver.sums.scale_down_events) if driver else (0, 0)))
        if seen[0] != seen[1]:
            return Failure("deterministic", f"{where}: a second run scaled or moved requests otherwise, or its "
                                            "tokens came at other times")
        events += sum(seen[0][2])
    run.report.cases = len(cases)
    run.report.notes.append(f"{events} scaling events in {len(cases)} simulated clusters" +
                            ("" if events else ": this autoscaler never scaled, so no scaling was checked"))
    return None


check_autoscaler.stage_info = StageInfo(  # type: ignore[attr-defined]
    "simulated clusters", f"{len(CASES)}, each twice and once without autoscaling", False,
    f"{NUM_REQUESTS} heavy-tailed requests on 1 replica that may grow to {MAX_REPLICAS} (small KV pools, "
    "least_outstanding), then with migration_policy=drain: every decision valid, tokens equal one replica's, "
    "every request ends once, no block held, within min/max replicas after every decision, the same scaling again")
