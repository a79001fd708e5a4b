"""``servelab serve [--host H] [--port P] [--api-key K] [hydra overrides]``: any composed stack
behind an OpenAI-compatible HTTP server (FastAPI + uvicorn).

The engine steps in its own thread; requests enter the scheduler as they arrive (arrival =
receipt time, on the wall clock). At shutdown (SIGINT/SIGTERM) the server stops accepting,
gives in-flight requests ``serve.shutdown_grace_s`` seconds, aborts the rest, and writes the same
result files as a batch run (``requests.jsonl``, ``summary.json``, ``config.yaml``; W&B as
configured) to ``hydra.run.dir`` (alias ``serve.output_dir``; default ``outputs/serve/<date>/<time>``).
"""

from __future__ import annotations

import argparse
import errno
import logging
import os
import socket
import sys
import threading
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from servelab.api import command_output_dir, compose_with_run_dir
from servelab.core.errors import ConfigError
from servelab.config import check_known_keys, recorded_config
from servelab.assemble.preflight import check_device
from servelab.results.loggers import RunLogger, make_logger
from servelab.results.writable import writable_folder
from servelab.results.writer import write_report
from servelab.run.session import RequestWriter, collect_results
from servelab.results.fairness import config_weights
from servelab.cluster.build import is_cluster
from servelab.assemble.stack import Stack, build_stack
from servelab.serve.engine_thread import EngineLoop
from servelab.workloads.text import checkpoint_text, text_decorator

log = logging.getLogger(__name__)


# the module docstring's first paragraph as plain text (argparse prints it as it is: no reST markup)
DESCRIPTION = "Any composed stack behind an OpenAI-compatible HTTP server (FastAPI + uvicorn)."


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(prog="servelab serve", description=DESCRIPTION,
                                     epilog="Every other argument is a Hydra override, as for a batch run "
                                            "(serve.* keys: see docs/serve.md).")
    parser.add_argument("--host", help="address to bind (default serve.host = 127.0.0.1: this machine only)")
    parser.add_argument("--port", type=int, help="TCP port (default serve.port = 8000; 0 = any free port)")
    parser.add_argument("--api-key", default=os.environ.get("SERVELAB_API_KEY"),
                        help="require 'Authorization: Bearer <key>' on /v1/* (default $SERVELAB_API_KEY; none)")
    flags, overrides = parser.parse_known_args(argv)
    unknown = [a for a in overrides if a.startswith("--")]
    if unknown:
        parser.error(f"unknown option {unknown[0]} (Hydra overrides are key=value)")
    return flags, overrides


def compose_serve_config(argv: list[str]) -> DictConfig:
    """The composed config with the flags applied; refuses what cannot serve on the wall clock.
    ``serve.output_dir`` is set to where the results will go (``hydra.run.dir`` first)."""
    flags, overrides = parse_args(argv)
    cfg = compose_command("serve", overrides)
    for key, value in (("host", flags.host), ("port", flags.port), ("api_key", flags.api_key)):
        if value is not None:
            cfg.serve[key] = value
    check_serve_config(cfg)
    return cfg


def compose_command(command: str, overrides: list[str]) -> DictConfig:
    """The composed config of a server command (``serve``, ``route``): Hydra's errors as one line,
    unknown keys refused, ``<command>.output_dir`` set to where its results go (``hydra.run.dir`` first)."""
    cfg, run_dir = compose_with_run_dir(overrides)
    check_known_keys(cfg)
    node = cfg[command]
    node.output_dir = str(command_output_dir(command, run_dir, node.output_dir))
    return cfg


def check_serve_config(cfg: DictConfig) -> None:
    check_device(cfg)
    config_weights(cfg)  # fairness.* are used at the end: refuse bad ones before serving
    clock = getattr(cfg.clock, "value", cfg.clock)
    if cfg.backend.name == "sim" or clock == "virtual":
        raise ConfigError("servelab serve answers real clients in real time: it needs the wall clock and a model "
                          "(backend=torch clock=wall), not backend=sim / clock=virtual")
    if is_cluster(cfg):
        raise ConfigError("servelab serve runs one engine: cluster.replicas / prefill_replicas / decode_replicas "
                          "are for run.py on the virtual clock (real replicas behind a router: servelab route replicas=N)")
    s = cfg.serve
    for key, ok in (("port", 0 <= s.port <= 65535), ("max_body_bytes", s.max_body_bytes >= 1024),
                    ("max_waiting_requests", s.max_waiting_requests >= 1),
                    ("default_max_tokens", s.default_max_tokens >= 1), ("shutdown_grace_s", s.shutdown_grace_s >= 0)):
        if not ok:
            raise ConfigError(f"serve.{key}={s[key]} is out of range (port 0-65535, max_body_bytes >= 1024, "
                              "max_waiting_requests >= 1, default_max_tokens >= 1, shutdown_grace_s >= 0)")


def main(argv: list[str]) -> int:
    cfg = compose_serve_config(argv)
    check_port_free(cfg.serve.host, cfg.serve.port)  # before the model loads and the results folder exists
    return serve(cfg)


def check_port_free(host: str, port: int, command: str = "serve") -> None:
    """Raise :class:`ConfigError` naming ``<command>.host`` when ``host`` is no address of this machine
    (it does not resolve, or nothing here has it), or ``<command>.port`` when another server holds the
    port. Port 0 (any free port) binds whenever the host does. SO_REUSEADDR as uvicorn sets it, so a
    port in TIME_WAIT after a previous server counts as free, as for uvicorn."""
    not_here = (f"{command}.host={host}: not an address of this machine ({{}}); use --host 127.0.0.1 (this "
                "machine only), 0.0.0.0 (every interface) or one of its addresses")
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    except (OSError, UnicodeError) as exc:  # socket.gaierror: not an address, and no name that resolves
        raise ConfigError(not_here.format(_reason(exc))) from None
    try:
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            probe.bind(address)
    except OSError as exc:
        if exc.errno == errno.EADDRNOTAVAIL:
            raise ConfigError(not_here.format(_reason(exc))) from None
        raise ConfigError(f"{command}.port={port}: cannot listen on {host}:{port} ({_reason(exc)}); choose another "
                          "with --port N (0 = any free port) or stop the server that holds it") from None


def _reason(exc: BaseException) -> str:
    return getattr(exc, "strerror", None) or str(exc) or type(exc).__name__


def serve(cfg: DictConfig) -> int:
    """Run the server until SIGINT/SIGTERM; write the result files; return the exit code."""
    import uvicorn  # noqa: PLC0415 - optional

    from servelab.serve.app import ServeState, TextCodec, build_app  # noqa: PLC0415 - optional
    from servelab.serve.metrics import ServeMetrics  # noqa: PLC0415 - optional

    s = cfg.serve
    output_dir = _output_dir(s.output_dir)
    stack = build_stack(cfg)
    engine = stack.engine
    engine.keep_steps = bool(cfg.debug.log_steps)
    text = checkpoint_text(cfg)
    codec = TextCodec(text)
    model_name = s.model_name or cfg.model.name
    metrics = ServeMetrics(model_name, stack.limits.ttft_slo_ms, stack.limits.tpot_slo_ms)
    metrics.cache_config(stack.limits.block_size, engine.allocator.num_blocks)
    logger = make_logger(cfg.logger)
    status, code, writer = "completed", 0, None
    try:
        logger.start(cfg, output_dir)
        writer = _record(engine, logger, metrics, text, output_dir)
        loop = _engine_loop(engine, codec, metrics, s.max_waiting_requests)
        state = ServeState(loop, codec, metrics, model_name, stack.limits.max_model_len,
                           stack.executor.spec.vocab_size, s.default_max_tokens, s.api_key, s.max_body_bytes)
        banner = (f"{model_name} ({cfg.scheduler.name}/{cfg.allocator.name}/{cfg.preemption.name}/"
                  f"{cfg.drafter.name}); results at shutdown: {output_dir}")
        config = uvicorn.Config(build_app(state), host=s.host, port=s.port, log_level="warning", access_log=False,
                                timeout_graceful_shutdown=s.shutdown_grace_s, lifespan="off")
        status, code = _run_server(config, engine, loop, banner)
    except BaseException as exc:
        status, code = f"failed: {type(exc).__name__}: {exc}", 1
        raise
    finally:
        try:
            _write_results(cfg, stack, writer, logger, status, code, output_dir)
        finally:
            stack.executor.shutdown()
    return code


def _output_dir(path: str | None) -> Path:
    """``serve.output_dir`` (:func:`compose_serve_config` sets it from ``hydra.run.dir``), by default
    ``outputs/serve/<date>/<time>``; created, and checked writable before the model loads."""
    return writable_folder(command_output_dir("serve", None, path), f"serve.output_dir={path}" if path
                           else "the serve folder")


def _record(engine, logger: RunLogger, metrics, text, output_dir: Path) -> RequestWriter:
    """Hook the logger, the ``requests.jsonl`` writer and the metrics onto the engine; the writer."""
    logger.attach(engine)
    writer = RequestWriter(output_dir / "requests.jsonl", engine, 1.0, decorate=text_decorator(text))
    writer.record_listeners.append(logger.log_request)
    engine.end_listeners += [writer.on_end, metrics.on_end]
    engine.forget_ended = True  # a long-running server holds only live requests
    return writer


def _engine_loop(engine, codec, metrics, max_waiting_requests: int) -> EngineLoop:
    """The engine thread (not started), reporting queues and KV usage to the metrics."""
    allocator = engine.allocator

    def kv_usage() -> float:
        return allocator.num_used_blocks() / max(1, allocator.num_blocks)

    return EngineLoop(engine, codec.decode if codec.available else None, max_waiting_requests,
                      on_step=lambda record: metrics.on_step(record, engine.scheduler.queue_lengths(), kv_usage()),
                      on_queues=lambda: metrics.on_queues(engine.scheduler.queue_lengths(), kv_usage()))


def _run_server(config, engine, loop: EngineLoop, banner: str) -> tuple[str, int]:
    """Serve (uvicorn ``config``) with the engine thread running until the server stops; the run's
    status and exit code."""
    server = _Server(config, loop, banner=banner)
    engine.reset_clock()
    loop.start()
    try:
        server.run()
    finally:
        loop.stop()
    if loop.error:
        return f"failed: {loop.error}", 1
    if not server.started:
        return "failed: the server did not start (address in use?)", 1
    return "completed", 0


def _write_results(cfg: DictConfig, stack: Stack, writer: RequestWriter | None, logger: RunLogger, status: str,
                   code: int, output_dir: Path) -> None:
    """The batch run's result files and the logger's finish, then one line on stderr."""
    result = collect_results(stack.engine, 1.0, status, {"tensor_parallel_size": cfg.tensor_parallel_size,
                                                         **stack.describe_time()},
                             writer=writer, fairness_weights=config_weights(cfg))
    result.write(output_dir, cfg.debug.log_steps)
    OmegaConf.save(recorded_config(cfg), output_dir / "config.yaml", resolve=True)  # a checkpoint's real shape
    if cfg.report:
        write_report(output_dir)
    logger.finish(result.summary, result.iter_requests(), code)
    summary = result.summary
    print(f"servelab serve: {summary['num_requests']} requests ({summary['num_finished']} finished, "
          f"{summary['num_aborted']} aborted, {summary['num_rejected']} rejected), leaked blocks "
          f"{summary['leaked_blocks']}", file=sys.stderr, flush=True)
    page = ", report.html" if cfg.report and (output_dir / "report.html").is_file() else ""
    print(f"results: {output_dir}/requests.jsonl, summary.json{page}", flush=True)  # the last line, as run.py's


def _make_server_class():
    import uvicorn  # noqa: PLC0415 - optional

    class Server(uvicorn.Server):
        """uvicorn's server, telling the engine thread to refuse new requests at the first signal and
        printing the bound address (``--port 0`` picks a free port) once it listens."""

        def __init__(self, config, loop, banner: str) -> None:
            super().__init__(config)
            self.engine_loop, self.banner = loop, banner

        def handle_exit(self, sig, frame) -> None:
            self.engine_loop.close()
            if not self.should_exit:
                grace = self.config.timeout_graceful_shutdown
                assert grace is not None  # serve.shutdown_grace_s, given to uvicorn.Config above
                # abort what is left shortly before uvicorn would cancel it, so its client gets a last
                # event (finish_reason "abort", then [DONE]) rather than a dropped connection
                timer = threading.Timer(max(0.0, grace - min(1.0, grace / 2)), self.engine_loop.abort_all)
                timer.daemon = True
                timer.start()
                print(f"servelab serve: shutting down: in-flight requests have "
                      f"{self.config.timeout_graceful_shutdown:g} s (serve.shutdown_grace_s) to finish, then are "
                      "aborted", file=sys.stderr, flush=True)
            super().handle_exit(sig, frame)
            self._captured_signals.clear()  # uvicorn re-raises them after shutdown: the results come first

        async def startup(self, sockets=None) -> None:
            await super().startup(sockets)
            if self.should_exit:
                return
            host, port = self.servers[0].sockets[0].getsockname()[:2]
            print(f"servelab serve: listening on http://{host}:{port} (OpenAI API under /v1) - {self.banner}",
                  flush=True)

    return Server


def _Server(config, loop, banner):  # noqa: N802 - a class made on first use (uvicorn is an optional extra)
    return _make_server_class()(config, loop, banner)
