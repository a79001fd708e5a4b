"""``servelab route [--host H] [--port P] [replicas=N] [hydra overrides]``: an OpenAI-compatible
router (FastAPI + uvicorn + httpx) running ``router=<name>`` in front of N backends (docs/route.md).

Backends: ``replicas=N`` (alias of ``route.replicas``) starts N ``servelab serve`` processes of the
composed stack on free local ports and stops them when the router stops (SIGINT/SIGTERM, or a failed
start-up); ``route.backends=[http://host:port,...]`` uses running OpenAI-compatible servers instead,
each checked at start-up (one line naming the first that is unreachable or has no ``/v1/models``).
The router plugin is built as in the simulator's cluster, through the kinds table
(:func:`servelab.cluster.router.build_router`), and places requests through the same cluster protocol.
"""

from __future__ import annotations

import argparse
import re
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from omegaconf import DictConfig

from servelab.cluster.router import build_router
from servelab.core.errors import ConfigError
from servelab.core.registry import Registry, default_registry
from servelab.serve.command import check_port_free, compose_command
from servelab.serve.route.backends import Backend, BackendPool, probe_backends
from servelab.serve.route.launch import ReplicaProcess, start_replicas, stop_replicas

if TYPE_CHECKING:
    from servelab.serve.route.app import RouteState

DESCRIPTION = "An OpenAI-compatible router running a router plugin in front of N backends (FastAPI + uvicorn)."
# the keys only the router reads: not passed to the replicas it starts
_ROUTER_ONLY = re.compile(r"^[~+]*(route\.|router[.=]|hydra\.run\.dir=|replicas=|backends=)")


def parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(prog="servelab route", description=DESCRIPTION,
                                     epilog="Every other argument is a Hydra override: replicas=N (route.replicas), "
                                            "route.* keys (docs/route.md), router=<name>, and the replicas' stack.")
    parser.add_argument("--host", help="address to bind (default route.host = 127.0.0.1)")
    parser.add_argument("--port", type=int, help="TCP port (default route.port = 8100; 0 = any free port)")
    flags, overrides = parser.parse_known_args(argv)
    unknown = [a for a in overrides if a.startswith("--")]
    if unknown:
        parser.error(f"unknown option {unknown[0]} (Hydra overrides are key=value)")
    return flags, [_alias(o) for o in overrides]


def _alias(override: str) -> str:
    """``replicas=N`` / ``backends=[...]`` as in the issue's command line: ``route.replicas`` / ``route.backends``."""
    for key in ("replicas", "backends"):
        if override.startswith(key + "="):
            return f"route.{override}"
    return override


def compose_route_config(argv: list[str]) -> tuple[DictConfig, list[str]]:
    """The composed config with the flags applied, and the overrides the replicas get."""
    flags, overrides = parse_args(argv)
    cfg = compose_command("route", overrides)
    for key, value in (("host", flags.host), ("port", flags.port)):
        if value is not None:
            cfg.route[key] = value
    check_route_config(cfg)
    return cfg, [o for o in overrides if not _ROUTER_ONLY.match(o)]


def check_route_config(cfg: DictConfig) -> None:
    r = cfg.route
    for key, ok in (("port", 0 <= r.port <= 65535), ("replicas", r.replicas >= 1), ("retries", r.retries >= 0),
                    ("refresh_interval_s", r.refresh_interval_s > 0), ("health_interval_s", r.health_interval_s > 0),
                    ("request_timeout_s", r.request_timeout_s > 0), ("start_timeout_s", r.start_timeout_s > 0)):
        if not ok:
            raise ConfigError(f"route.{key}={r[key]} is out of range (port 0-65535, replicas >= 1, retries >= 0, "
                              "intervals and timeouts > 0)")
    default_registry().get("router", cfg.router.name)  # an unknown router: one line listing the known ones


def prompt_codec(cfg: DictConfig, backends: list[Backend], started: bool):
    """The checkpoint's tokenizer when every backend serves this config's model (replicas it started,
    or servelab servers of the same model name); else the byte-level fallback."""
    from servelab.serve.app import TextCodec  # noqa: PLC0415 - FastAPI, an optional extra
    from servelab.serve.route.app import PromptCodec  # noqa: PLC0415
    from servelab.workloads.text import checkpoint_text  # noqa: PLC0415

    name = cfg.serve.model_name or cfg.model.name
    same = started or all(b.owned_by == "servelab" and b.model == name for b in backends)
    return PromptCodec(TextCodec(checkpoint_text(cfg)) if same else None)


@dataclass
class RouteProcess:
    """A running router: its URL, its state (backends, metrics) and the replicas it started."""

    url: str
    state: RouteState
    replicas: list[ReplicaProcess] = field(default_factory=list)
    server: Any = None
    thread: threading.Thread | None = None

    def stop(self) -> None:
        if self.server is not None:
            self.server.should_exit = True
        if self.thread is not None:
            self.thread.join(30)
        stop_replicas(self.replicas)


def prepare(cfg: DictConfig, replica_overrides: list[str], registry: Registry | None = None):
    """The backends (started or probed), the router plugin and the app's state; replicas it started
    are stopped again when anything here fails."""
    from servelab.serve.route.app import RouteState  # noqa: PLC0415 - FastAPI, an optional extra
    from servelab.serve.route.drain import start_draining  # noqa: PLC0415
    from servelab.serve.route.metrics import RouteMetrics  # noqa: PLC0415

    r = cfg.route
    replicas: list[ReplicaProcess] = []
    try:
        if r.backends:
            backends = probe_backends(list(r.backends))
        else:
            replicas = start_replicas(r.replicas, replica_overrides, Path(r.output_dir), r.start_timeout_s)
            backends = probe_backends([p.url for p in replicas])
        router = build_router(cfg, [b.view(True) for b in backends], registry)
        pool = BackendPool(backends, r.refresh_interval_s, r.health_interval_s, r.request_timeout_s)
        state = RouteState(pool, router, cfg.router.name, prompt_codec(cfg, backends, bool(replicas)),
                           RouteMetrics(cfg.router.name, [b.url for b in backends]), r.retries,
                           cfg.serve.default_max_tokens)
        start_draining(state, list(r.draining))
    except BaseException:
        stop_replicas(replicas, grace_s=5.0)
        raise
    return state, replicas


def start_in_thread(cfg: DictConfig, replica_overrides: Sequence[str] = (),
                    registry: Registry | None = None) -> RouteProcess:
    """The router on ``route.host:route.port`` (0 = any free port) in a thread of this process, for
    tests and ``check-plugin`` (``registry``: where ``router=<name>`` is found; default the installed
    plugins); :meth:`RouteProcess.stop` stops it and the replicas it started."""
    import uvicorn  # noqa: PLC0415 - optional

    from servelab.serve.route.app import build_route_app  # noqa: PLC0415

    state, replicas = prepare(cfg, list(replica_overrides), registry)
    config = uvicorn.Config(build_route_app(state), host=cfg.route.host, port=cfg.route.port, log_level="warning",
                            access_log=False)
    server = uvicorn.Server(config)
    # uvicorn installs no signal handlers outside the main thread: the caller stops it
    thread = threading.Thread(target=server.run, daemon=True, name="servelab-route")
    thread.start()
    deadline = time.monotonic() + 60
    while not server.started and thread.is_alive() and time.monotonic() < deadline:
        time.sleep(0.02)
    if not server.started:
        stop_replicas(replicas, grace_s=5.0)
        raise ConfigError(f"servelab route did not start on {cfg.route.host}:{cfg.route.port}")
    host, port = server.servers[0].sockets[0].getsockname()[:2]
    return RouteProcess(f"http://{host}:{port}", state, replicas, server, thread)


def main(argv: list[str]) -> int:
    import uvicorn  # noqa: PLC0415 - optional

    from servelab.serve.route.app import build_route_app  # noqa: PLC0415

    cfg, replica_overrides = compose_route_config(argv)
    check_port_free(cfg.route.host, cfg.route.port, "route")  # before any replica starts
    state, replicas = prepare(cfg, replica_overrides)
    try:
        urls = ", ".join(b.url for b in state.pool.backends)
        codec = "the checkpoint's tokenizer" if state.codec.exact else "UTF-8 bytes (not the backends' tokenizer)"
        config = uvicorn.Config(build_route_app(state), host=cfg.route.host, port=cfg.route.port,
                                log_level="warning", access_log=False)
        server = _announcing_server(config, f"router={cfg.router.name} over {len(state.pool.backends)} backends "
                                            f"({urls}); the router sees prompts as {codec}")
        server.run()
        if not server.started:
            print("servelab route: the router did not start (address in use?)", file=sys.stderr)
            return 1
    finally:
        if replicas:
            print(f"servelab route: stopping {len(replicas)} replicas (their results: {cfg.route.output_dir})",
                  file=sys.stderr, flush=True)
        stop_replicas(replicas)
    return 0


def _announcing_server(config, banner: str):
    import uvicorn  # noqa: PLC0415 - optional

    class Server(uvicorn.Server):
        def handle_exit(self, sig, frame) -> None:
            super().handle_exit(sig, frame)
            self._captured_signals.clear()  # uvicorn would re-raise it after shutdown: the replicas stop first

        async def startup(self, sockets=None) -> None:
            await super().startup(sockets)
            if not self.should_exit:
                host, port = self.servers[0].sockets[0].getsockname()[:2]
                print(f"servelab route: listening on http://{host}:{port} (OpenAI API under /v1) - {banner}",
                      flush=True)

    return Server(config)
