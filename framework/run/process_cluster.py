"""A wall-clock cluster job end to end (:mod:`servelab.cluster.procs.cluster`): check the config, start the
engine processes, run the workload through the router, write the result files (partial ones too,
whatever happens) through the same writer and summary as the simulator's cluster."""

from __future__ import annotations

from pathlib import Path

from omegaconf import DictConfig

from servelab.core.errors import ConfigError
from servelab.core.registry import Registry, default_registry
from servelab.assemble.block_size import resolve_block_size
from servelab.cluster.build import check_kv_compatible, cluster_pools, migration_settings, validate_cluster
from servelab.cluster.router import build_migration_policy, build_router
from servelab.results.cluster_summary import cluster_summary
from servelab.results.fairness import config_weights
from servelab.results.loggers import make_logger
from servelab.cluster.procs.cluster import ProcessCluster
from servelab.results.writer import RequestWriter, RunResult, requests_format, run_and_write
from servelab.assemble.executor import model_shape
from servelab.assemble.stack import run_arrivals
from servelab.assemble.validate import validate
from servelab.workloads.text import checkpoint_text, text_decorator


def run_process_cluster_job(cfg: DictConfig, output_dir: Path, requests, banner: bool = False,
                            registry: Registry | None = None) -> RunResult:
    """Run ``requests`` on ``cfg.cluster``'s replicas as engine processes; the router from ``registry``
    (each process builds its stack from the installed plugins)."""
    validate(cfg)
    validate_cluster(cfg)
    if cfg.get("strict_requests", False):
        raise ConfigError("strict_requests=true checks every request against one engine before the run; a wall-clock "
                          "cluster's engines live in their own processes, so it is not checked there: drop "
                          "strict_requests (a request a replica cannot hold is rejected with its reason)")
    registry = registry or default_registry()
    resolve_block_size(cfg, model_shape(cfg), requests)  # once for every replica (no-op unless auto)
    pools = cluster_pools(cfg)
    if cfg.cluster.prefill_replicas is not None:
        check_kv_compatible(pools[0][2], pools[1][2])  # one line naming both pools, before any process starts
    weights = config_weights(cfg)
    decorate = text_decorator(checkpoint_text(cfg))
    policy = build_migration_policy(cfg, sum(count for _, count, _ in pools), registry)
    cluster = ProcessCluster(pools, lambda views: build_router(cfg, views, registry), cfg.workload.time_scale,
                             policy, migration_settings(cfg))
    try:
        cluster.start()
        logger = make_logger(cfg.logger)
        logger.start(cfg, output_dir)
        if banner:
            roles = ", ".join(f"{n} {role}" for role, n, _ in pools)
            print(f" cluster  {roles} engine processes on the wall clock, router={cfg.router.name}", flush=True)
        answering = (cluster.decode or cluster.mixed)[0]
        writer = RequestWriter(output_dir / "requests.jsonl", None, cfg.workload.time_scale, decorate=decorate,
                               live=cluster.live_sequences, limits=answering.limits,
                               requests_format=requests_format(cfg))
        writer.record_listeners.append(logger.log_request)
        cluster.request_listeners.append(writer.on_end)

        def collect(status: str) -> RunResult:
            cluster.stop(finish=status == "completed")  # a completed run's replicas hold nothing
            writer.close()
            migrations = cluster.migration.sums if cluster.migration is not None else None
            return cluster_summary(cfg, cluster.replicas, cluster.reports(), cluster.kv, status, writer, weights,
                                   migrations)

        return run_and_write(cfg, output_dir, writer, logger, len(requests),
                             lambda on_progress: cluster.run(run_arrivals(cfg, requests), on_progress), collect)
    finally:
        cluster.stop()
