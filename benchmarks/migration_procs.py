"""Live migration between engine processes on this machine: per-migration times and bytes against length.

    python benchmarks/migration_procs.py                      # prompts of 32, 160 and 400 tokens, 3 repeats
    python benchmarks/migration_procs.py --prompts 64 256 --repeats 1

Two ``model=tiny_code`` engine processes (``cluster.replicas=2``, real backend, wall clock, one torch
thread each). A router placed here puts every request on replica 1; a policy placed here moves each
request to replica 0 once it has ``--after`` output tokens. The requests (one per prompt length,
``ignore_eos``, ``--max-tokens`` each) arrive ``--gap`` seconds apart, so each migrates alone. Per
setting the cluster runs ``--repeats`` times, with pre-copy (``cluster.migration_precopy=true``, the
default) and without (all of the KV copied while the request is stopped), and once as one engine:
every run's tokens must equal the one engine's.

For each migration it prints the pre-copy time (from the policy's decision to the stop, the request
decoding on its source meanwhile), the stages, the downtime (the stop's read on the source to the KV
written on the target, the target's step boundary included) and the bytes; medians over the repeats.
The figures are a shared, loaded box's (the two processes and this one compete for its cores), not a
dedicated machine's, and tiny_code's KV is 2 KiB a token: the copies are small, the downtime is mostly
the two processes' step boundaries and the parent's relay.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np

import servelab.run.process_cluster as process_cluster
from servelab import hookimpl
from servelab.api import LLM, compose
from servelab.core.interfaces import Router
from servelab.core.migration_policy import Migrate, MigrationPolicy
from servelab.core.request import Request
from servelab.run.cluster_run import run_cluster_job
from servelab.testing import registry_with

BASE = ["model=tiny_code", "logger=none", "progress=false", "backend.num_threads=1"]
CLUSTERS: list = []  # every cluster the runs started (its migration records)


class Capturing(process_cluster.ProcessCluster):
    def start(self) -> None:
        super().start()
        CLUSTERS.append(self)


process_cluster.ProcessCluster = Capturing  # type: ignore[misc] - the records, beside the summary's figures


class OntoLast(Router):
    name = "onto_last"

    def route(self, request, replicas, now):
        return replicas[-1].index


class MoveAfter(MigrationPolicy):
    """Moves each request decoding on the last replica to replica 0 once it has ``AFTER`` outputs."""

    name = "move_after"
    AFTER = 8

    def decide(self, replicas, now):
        return [Migrate(q.id, 0) for q in replicas[-1].running if not q.migrating and q.num_output_tokens >= self.AFTER]


class _Plugins:
    @hookimpl
    def servelab_register_routers(self):
        return [OntoLast]

    @hookimpl
    def servelab_register_migration_policies(self):
        return [MoveAfter]


def requests(prompts: list[int], max_tokens: int, gap: float) -> list[Request]:
    rng = np.random.default_rng(0)
    return [Request(id=f"p{n}", prompt_token_ids=tuple(int(t) for t in rng.integers(32, 127, n)),
                    max_tokens=max_tokens, arrival_time=gap * i, ignore_eos=True) for i, n in enumerate(prompts)]


def tokens(out: Path) -> dict:
    return {r["id"]: r["output_token_ids"] for r in map(json.loads, (out / "requests.jsonl").open())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, nargs="+", default=[32, 160, 400])
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--after", type=int, default=8)
    ap.add_argument("--gap", type=float, default=2.0)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    MoveAfter.AFTER = args.after
    registry = registry_with(_Plugins())
    reqs = requests(args.prompts, args.max_tokens, args.gap)
    tmp = Path(tempfile.mkdtemp(prefix="migration_procs-"))
    LLM(BASE, progress=False).run(tmp / "one", requests=reqs)
    want = tokens(tmp / "one")
    rows: dict = {}
    for precopy in (True, False):
        for rep in range(args.repeats):
            out = tmp / f"{'pre' if precopy else 'stop'}{rep}"
            cfg = compose([*BASE, "cluster.replicas=2", "router=onto_last", "migration_policy=move_after",
                           "cluster.migration_interval_s=0.01", f"cluster.migration_precopy={str(precopy).lower()}"])
            run_cluster_job(cfg, out, requests=reqs, registry=registry)
            assert tokens(out) == want, f"{out}: tokens differ from one engine's"
            summary = json.loads((out / "summary.json").read_text())
            assert summary["num_aborted_migrations"] == 0, summary["aborted_migrations"]
            for m in CLUSTERS[-1].migration.sums.done:
                rows.setdefault((precopy, m.request_id), []).append(m)
    print(f"tokens equal one engine's in every run ({2 * args.repeats} cluster runs); medians of {args.repeats}")
    print(f"{'pre-copy':>8} {'prompt':>6} {'tokens':>6} {'KiB':>7} {'stages':>6} {'pre-copy ms':>11} {'downtime ms':>11}")
    for (precopy, rid), ms in sorted(rows.items(), key=lambda kv: (not kv[0][0], int(kv[0][1][1:]))):
        print(f"{'on' if precopy else 'off':>8} {rid[1:]:>6} {np.median([m.num_tokens for m in ms]):>6.0f} "
              f"{np.median([m.nbytes for m in ms]) / 1024:>7.0f} {np.median([m.num_stages for m in ms]):>6.0f} "
              f"{np.median([(m.stop_s - m.start_s) * 1e3 for m in ms]):>11.1f} "
              f"{np.median([m.downtime_s * 1e3 for m in ms]):>11.1f}")


if __name__ == "__main__":
    main()
