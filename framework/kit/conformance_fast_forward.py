"""``check-plugin scheduler=<x>`` and ``allocator=<x>``: the simulator's fast-forward
(``sim.fast_forward``, :mod:`servelab.engine.fast_forward`) changes no result.

The plugin runs a few short simulations (``backend=sim``, loads from light to memory-tight, with
and without prefix caching), each twice: fast-forward on and off. Every request's record
(``requests.jsonl``) and the summary must be identical. When they differ, the plugin's
declaration -- :meth:`Scheduler.next_decision` (and a queue scheduler's
:meth:`~servelab.engine.scheduling.QueueScheduler.arrivals_beside_decodes`: an arrival's step with
the running decodes taken in bulk) or :meth:`BlockAllocator.quiet_decode_tokens` -- called a step
quiet in which the plugin would have acted differently; the failure names the plugin, the run and
the first field that differs.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from servelab.kit.conformance import Failure, KitRun

CONTRACT = "fast-forward exact"
CONTRACT_TEXT = ("the simulator's results (summary.json, requests.jsonl) are identical with sim.fast_forward on and "
                 "off: next_decision() / arrivals_beside_decodes() / quiet_decode_tokens() name only steps in which the "
                 "plugin would not act")
BASE = ("backend=sim", "hardware=h100", "model=llama3_8b", "max_model_len=2048")
#: The SLO classes of the last run (``workload.slo_classes``): a deadline- or lateness-aware order
#: acts on them while requests decode (a TPOT target a request can miss), which a declaration must see.
SLO_CLASSES = ("[{name:tight,share:2,ttft_ms:150,tpot_ms:12,priority:0},{name:loose,share:2,ttft_ms:3000,tpot_ms:60,"
               "priority:1},{name:none,share:1,priority:2}]")
RUNS = (  # light load; memory-tight (preemption); shared prefixes in a small cache; few seats; mixed SLOs
    ("workload.num_requests=40", "workload.rate=4"),
    ("workload.num_requests=60", "workload.rate=80", "num_kv_blocks=90"),
    ("workload=chat_sessions", "workload.num_sessions=16", "workload.session_rate=8", "workload.think_time_s=1",
     "allocator.prefix_caching=true", "num_kv_blocks=160"),
    ("workload.num_requests=40", "workload.rate=40", "max_num_seqs=4"),
    ("workload.num_requests=60", "workload.rate=40", "num_kv_blocks=150", f"workload.slo_classes={SLO_CLASSES}"),
)
FIRST_KEYS = ("num_steps", "duration_s", "ttft_ms", "tpot_ms", "e2e_ms", "num_preemptions")
SUMMARY_SKIPPED = ("wall_s",)  # the run's own wall time, if a summary carries it


def run_both_ways(overrides: tuple[str, ...], registry) -> tuple[str | None, int, int]:
    """Run ``overrides`` in the simulator with fast-forward on and off; returns (the first
    difference or None, steps fast-forwarded (-1 for a cluster: not counted), steps)."""
    from servelab.api import compose  # noqa: PLC0415 - torch
    from servelab.cluster.build import is_cluster  # noqa: PLC0415
    from servelab.run.cluster_run import run_cluster_job  # noqa: PLC0415
    from servelab.run.session import run_job  # noqa: PLC0415
    from servelab.assemble.stack import build_stack  # noqa: PLC0415

    out = {}
    with tempfile.TemporaryDirectory(prefix="servelab-ff-") as tmp:
        for on in (True, False):
            cfg = compose([*overrides, f"sim.fast_forward={str(on).lower()}"], logger="none", progress=False)
            folder = Path(tmp) / str(on)
            if is_cluster(cfg):  # the replicas' engines are the cluster's own: no count of skipped steps
                run_cluster_job(cfg, folder, registry=registry)
                forwarded = -1
            else:
                stack = build_stack(cfg, registry)
                run_job(cfg, folder, stack=stack)
                forwarded = stack.engine.num_fast_forwarded
            summary = json.loads((folder / "summary.json").read_text())
            out[on] = (summary, (folder / "requests.jsonl").read_text().splitlines(), forwarded)
    (s_on, r_on, ff), (s_off, r_off, _) = out[True], out[False]
    steps = int(s_off.get("num_steps", 0))
    first = [k for k in FIRST_KEYS if k in s_on or k in s_off]  # the plainest difference first
    for key in first + sorted((set(s_on) | set(s_off)) - set(first)):
        if key not in SUMMARY_SKIPPED and s_on.get(key) != s_off.get(key):
            return f"summary.json {key}: {s_on.get(key)!r} with fast-forward, {s_off.get(key)!r} without", ff, steps
    for line_on, line_off in zip(r_on, r_off):
        if line_on != line_off:
            a, b = json.loads(line_on), json.loads(line_off)
            field = next((k for k in a if a.get(k) != b.get(k)), "order")
            return (f"requests.jsonl, request {a.get('id')!r} ({b.get('id')!r} without) {field}: {a.get(field)!r} "
                    f"with fast-forward, {b.get(field)!r} without"), ff, steps
    if len(r_on) != len(r_off):
        return f"requests.jsonl has {len(r_on)} lines with fast-forward, {len(r_off)} without", ff, steps
    return None, ff, steps


def check_fast_forward(run: KitRun) -> Failure | None:
    """The kit's stage (skipped while an earlier stage failed: one root cause at a time)."""
    if run.report.failures:
        return None
    from hydra.errors import ConfigCompositionException  # noqa: PLC0415

    from servelab.core.errors import ConfigError  # noqa: PLC0415
    from servelab.kit.conformance import CONTRACTS, Failure, merge_overrides  # noqa: PLC0415

    CONTRACTS.setdefault(CONTRACT, CONTRACT_TEXT)
    declaration = "next_decision()" if run.kind == "scheduler" else "quiet_decode_tokens()"
    declared = "next_decision() or arrivals_beside_decodes()" if run.kind == "scheduler" else declaration
    forwarded = total = 0
    for extra in RUNS:
        overrides = merge_overrides(BASE + extra, (f"{run.kind}={run.name}",) + run.extra)
        try:
            difference, ff, steps = run_both_ways(overrides, run.registry)
        except (ConfigError, ConfigCompositionException) as exc:  # a setting it refuses or lacks (prefix caching)
            run.report.notes.append(f"fast-forward run skipped: {str(exc).splitlines()[0]}")
            continue
        except Exception as exc:  # noqa: BLE001 - the run fails either way: the kit's other stages name that
            run.report.notes.append(f"fast-forward check stopped: the simulated run failed ({type(exc).__name__}: "
                                    f"{str(exc).splitlines()[0] if str(exc) else ''})")
            return None
        forwarded, total = forwarded + max(ff, 0), total + steps
        if difference is not None:
            return Failure(CONTRACT, f"{run.kind} plugin {run.name!r}: {difference}; its {declared} called a step "
                                     f"quiet in which it would have acted (run: {' '.join(overrides)})")
    if not forwarded:
        run.report.notes.append(f"the simulator never fast-forwarded {run.kind}={run.name} ({declaration} keeps the "
                                "default: every step is scheduled; correct, only slower)")
    else:
        run.report.notes.append(f"fast-forward exact: {forwarded} of {total} simulated steps skipped the policies")
    return None
