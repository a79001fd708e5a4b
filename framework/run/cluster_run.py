"""A cluster job end to end: build the replicas, run the workload through the router, write the
result files (partial ones too, whatever happens), log the run. On the wall clock (a real backend,
``clock=auto``) the replicas are engine processes (:mod:`servelab.run.process_cluster`); on the
virtual clock, one discrete-event loop in this process (here). The one-engine form is
:func:`servelab.run.session.run_job`, which hands ``cluster.*`` configs here; what both write
is :mod:`servelab.results.writer`."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path

from omegaconf import DictConfig

from servelab.cluster.simulated import Cluster
from servelab.core.request import Request
from servelab.core.registry import Registry
from servelab.assemble.block_size import workload_requests
from servelab.cluster.build import build_cluster
from servelab.results.fairness import config_weights
from servelab.results.loggers import make_logger
from servelab.assemble.preflight import check_requests
from servelab.results.replica_report import ReplicaReport
from servelab.results.cluster_summary import cluster_summary
from servelab.results.writer import RequestWriter, RunResult, drop_placeholder_tokens, requests_format, run_and_write
from servelab.assemble.executor import model_shape
from servelab.assemble.stack import Stack, run_arrivals
from servelab.assemble.validate import clock_kind
from servelab.workloads.text import checkpoint_text, text_decorator


#: ``probe(cluster, requests)``: called once the simulated cluster is built, before it runs.
ClusterProbe = Callable[[Cluster, Sequence[Request]], None]


def run_cluster_job(cfg: DictConfig, output_dir: Path, requests=None, banner: bool = False,
                    registry: Registry | None = None, probe: ClusterProbe | None = None) -> RunResult:
    """Run ``cfg``'s workload (or ``requests``) on the cluster ``cfg.cluster`` describes, its plugins
    (the router too) from ``registry`` (default: the installed ones).

    ``probe(cluster, requests)``, on the simulator's cluster only (the virtual clock), is called with
    the built :class:`Cluster` and the run's requests before the cluster runs: a read-only observer
    (such as :class:`servelab.cluster.fragmentation.FragmentationProbe`) attaches its events to the
    cluster's loop there. It must change nothing the run computes; it is the caller's code, not a
    config's. Engine-process clusters (the wall clock) take no probe (``ValueError``)."""
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    if requests is None:
        requests = workload_requests(cfg, model_shape(cfg))  # once, for every replica and block_size=auto
    if clock_kind(cfg) == "wall":  # real engines on the wall clock: one process each
        if probe is not None:
            raise ValueError("run_cluster_job(probe=...) observes the simulator's cluster only; this config "
                             "runs engine processes on the wall clock")
        # imported here: engine processes need torch.multiprocessing, which a simulated run never loads (~1 s)
        from servelab.run.process_cluster import run_process_cluster_job  # noqa: PLC0415

        return run_process_cluster_job(cfg, output_dir, requests, banner, registry)
    cluster, stacks = build_cluster(cfg, requests, registry)
    try:
        if probe is not None:
            probe(cluster, requests)
        return _run(cfg, output_dir, requests, cluster, stacks, banner)
    finally:
        for stack in stacks:
            stack.executor.shutdown()


def _run(cfg: DictConfig, output_dir: Path, requests, cluster: Cluster, stacks: list[Stack], banner: bool):
    first = cluster.replicas[0].engine
    weights = config_weights(cfg)
    check_requests(cfg, first, requests)
    decorate = text_decorator(checkpoint_text(cfg)) if cfg.backend.name != "sim" else drop_placeholder_tokens
    logger = make_logger(cfg.logger)
    logger.start(cfg, output_dir)
    if banner:
        from servelab.results.banner import print_banner  # noqa: PLC0415 - rich

        print_banner(cfg, stacks[0], output_dir, logger.where(), cluster=cluster)
    answering = (cluster.decode or cluster.mixed)[0].engine  # its limits carry the run's SLO targets
    writer = RequestWriter(output_dir / "requests.jsonl", answering, cfg.workload.time_scale, decorate=decorate,
                           live=cluster.live_sequences, requests_format=requests_format(cfg))
    writer.record_listeners.append(logger.log_request)
    cluster.request_listeners.append(writer.on_end)
    for r in cluster.replicas:
        r.engine.keep_steps = bool(cfg.debug.log_steps)
        r.engine.forget_ended = True
    return run_and_write(
        cfg, output_dir, writer, logger, len(requests),
        lambda on_progress: cluster.run(run_arrivals(cfg, requests), on_progress=on_progress),
        lambda status: collect_cluster_results(cfg, cluster, stacks, status, writer, weights))


def collect_cluster_results(cfg: DictConfig, cluster: Cluster, stacks: list[Stack], status: str,
                            writer: RequestWriter, weights) -> RunResult:
    """``summary.json`` of the simulator's cluster, from its live engines (:func:`cluster_summary`)."""
    writer.close()
    live = bool(cluster.live_sequences())
    reports = [ReplicaReport.of(stack, live) for stack in stacks]
    migrations = cluster.migration.sums if cluster.migration is not None else None
    result = cluster_summary(cfg, cluster.replicas, reports, cluster.kv_transfer_sums(), status, writer, weights,
                             migrations)
    if cluster.autoscale is not None:  # written only then: autoscaler=none writes today's summary
        result.summary.update({"autoscaler": cfg.autoscaler.name,
                               **cluster.autoscale.figures(result.summary["duration_s"])})
    return result
