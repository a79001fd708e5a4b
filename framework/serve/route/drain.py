"""Draining a backend of ``servelab route`` for a rolling restart (docs/route.md, "Draining").

A draining backend takes no new request: it is in the cluster protocol's ``draining`` books, the
same books as ``cluster.draining`` on the simulator, so the router plugin sees it with
``can_hold=False`` (as Envoy's EDS ``DRAINING`` host status: no new requests, the ones under way
finish). Its in-flight requests finish where they are; once none is left it is *drained*, and the
operator may restart it, then undrain it. A backend's state is ``active``, ``draining`` or ``drained``.

The admin endpoints (:func:`add_admin_routes`):

- ``GET /admin/backends``: every backend: index, URL, model, up, state, in-flight requests;
- ``POST /admin/drain?backend=B[&wait_s=S]``: start draining ``B`` (its URL, or its index); with
  ``wait_s``, answer once it is drained (200) or after ``S`` seconds (202, still draining);
- ``POST /admin/undrain?backend=B``: it takes new requests again.

An unknown or missing ``backend`` is one line (404 / 400). ``route.draining=[B,...]`` starts backends
drained (:func:`start_draining`). The admin endpoints have no authentication, like the rest of the
router: bind it where only operators reach it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Iterable

from fastapi import FastAPI
from fastapi.responses import JSONResponse

from servelab.core.errors import ConfigError
from servelab.serve.protocol import error_body
from servelab.serve.route.backends import Backend

if TYPE_CHECKING:
    from servelab.serve.route.app import RouteState

log = logging.getLogger(__name__)
STATES = ("active", "draining", "drained")
POLL_S = 0.05  # how often a drain with wait_s looks again


class UnknownBackend(LookupError):
    """``name`` is no backend's URL or index (the message lists them)."""


def find_backend(backends: list[Backend], name: str) -> Backend:
    """The backend ``name`` names: its URL (a trailing ``/`` ignored) or its index."""
    name = name.strip()
    for b in backends:
        if b.url == name.rstrip("/") or name == str(b.index):
            return b
    raise UnknownBackend(f"unknown backend {name!r}: not one of {', '.join(b.url for b in backends)} "
                         f"(or their indices 0-{len(backends) - 1})")


def state_of(state: RouteState, backend: Backend) -> str:
    """``active``, ``draining`` (in-flight requests left) or ``drained``."""
    if backend.index not in state.protocol.draining:
        return "active"
    return "draining" if backend.num_outstanding else "drained"


def report(state: RouteState, backend: Backend) -> dict:
    return {"index": backend.index, "url": backend.url, "model": backend.model, "up": backend.up,
            "state": state_of(state, backend), "in_flight": backend.num_outstanding}


def set_draining(state: RouteState, backend: Backend, draining: bool) -> None:
    """``backend`` starts (or stops) draining: the protocol's books, the gauge, one log line."""
    books = state.protocol.draining
    if draining == (backend.index in books):
        return
    if draining:
        books.add(backend.index)
    else:
        books.discard(backend.index)
    state.metrics.draining.labels(backend.url).set(1 if draining else 0)
    log.warning("servelab route: backend %s %s", backend.url,
                f"draining ({backend.num_outstanding} in flight)" if draining else "takes requests again")
    if draining and not backend.num_outstanding:
        log.warning("servelab route: backend %s is drained", backend.url)


def ended(state: RouteState, backend: Backend) -> None:
    """A request left ``backend``: say so when that drained it."""
    if backend.index in state.protocol.draining and not backend.num_outstanding:
        log.warning("servelab route: backend %s is drained", backend.url)


def start_draining(state: RouteState, names: Iterable[str]) -> None:
    """``route.draining``: these backends start drained; an unknown one is a :class:`ConfigError`."""
    for name in names:
        try:
            backend = find_backend(state.pool.backends, str(name))
        except UnknownBackend as exc:
            raise ConfigError(f"route.draining: {exc}") from None
        set_draining(state, backend, True)


def add_admin_routes(app: FastAPI, state: RouteState) -> None:
    def named(backend: str | None) -> Backend | JSONResponse:
        if not backend:
            return _error(400, "backend: missing (?backend=<its URL or index>; GET /admin/backends lists them)")
        try:
            return find_backend(state.pool.backends, backend)
        except UnknownBackend as exc:
            return _error(404, str(exc))

    @app.get("/admin/backends")
    async def backends():
        return {"backends": [report(state, b) for b in state.pool.backends]}

    @app.post("/admin/drain")
    async def drain(backend: str | None = None, wait_s: str = "0"):
        b = named(backend)
        if isinstance(b, JSONResponse):
            return b
        try:
            wait = float(wait_s)
        except ValueError:
            wait = -1.0
        if not 0 <= wait <= 24 * 3600:
            return _error(400, f"wait_s={wait_s}: must be 0 (answer at once) to 86400 seconds")
        set_draining(state, b, True)
        deadline = time.monotonic() + wait
        while state_of(state, b) == "draining" and time.monotonic() < deadline:
            await asyncio.sleep(POLL_S)
        out = report(state, b)
        return JSONResponse(out, status_code=202 if out["state"] == "draining" else 200)

    @app.post("/admin/undrain")
    async def undrain(backend: str | None = None):
        b = named(backend)
        if isinstance(b, JSONResponse):
            return b
        set_draining(state, b, False)
        return report(state, b)


def _error(code: int, message: str) -> JSONResponse:
    return JSONResponse(error_body(message, code), status_code=code)
