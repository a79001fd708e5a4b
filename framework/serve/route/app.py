"""The FastAPI application of ``servelab route``: OpenAI's completions and chat completions placed on
a backend by a router plugin and passed through; ``/v1/models``, ``/health``, ``/metrics``.

For each request the handler reads the body just enough to build the :class:`Request` a router sees
(:func:`request_of`), places it through the cluster protocol (:mod:`servelab.cluster.protocol`, as the
simulator's cluster and the engine processes do: one view per backend, :mod:`servelab.serve.route.backends`,
the plugin's answer checked, the router's counts), forwards the raw body and relays the answer: JSON
as it came, or server-sent events chunk by chunk as they arrive. ``on_finish`` is called once per
placement when the request ends there (answered, failed or left). A client that disconnects closes
the upstream connection, which a ``servelab serve`` backend takes as an abort. A backend that cannot
be reached, or fails or answers 503 before sending anything, is marked down (connection failures) and
the request goes to another backend, at most ``route.retries`` times; one that dies mid-stream ends
the stream with an error event naming it. A router plugin that raises or answers an invalid index
gives the client a 500 naming the plugin, and the router keeps serving. A draining backend
(:mod:`servelab.serve.route.drain`: ``/admin/drain``) is offered to the plugin as full.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
from fastapi import FastAPI, Request as HTTPRequest
from fastapi.responses import JSONResponse, Response, StreamingResponse

from servelab.cluster.protocol import ClusterProtocol
from servelab.core.interfaces import Router, RouterError
from servelab.core.request import Request
from servelab.serve.protocol import error_body
from servelab.serve.route import drain
from servelab.serve.route.backends import Backend, BackendPool
from servelab.serve.route.metrics import CONTENT_TYPE_LATEST, RouteMetrics

log = logging.getLogger(__name__)
HOP_HEADERS = {"host", "content-length", "connection", "transfer-encoding", "keep-alive", "accept-encoding"}


class PromptCodec:
    """Prompt text -> the token ids a router sees. With the backends' own tokenizer (``text``: a
    :class:`servelab.serve.app.TextCodec` of the checkpoint every backend serves) the ids are the
    ones the backend will compute on; without it (other models, other servers) the UTF-8 bytes of the
    text: stable, so equal prefixes still share blocks, but longer than the real prompt."""

    def __init__(self, text=None) -> None:
        self.text = text if text is not None and text.available else None

    @property
    def exact(self) -> bool:
        return self.text is not None

    def completion(self, prompt: Any) -> list[int]:
        if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
            return list(prompt)
        text = prompt if isinstance(prompt, str) else json.dumps(prompt)
        if self.text is not None and isinstance(prompt, str) and prompt:
            return self.text.encode(text)
        return list(text.encode())

    def chat(self, messages: Any) -> list[int]:
        if self.text is not None:
            try:
                return self.text.chat([{"role": m["role"], "content": m["content"]} for m in messages], True)
            except Exception:  # noqa: BLE001 - content parts, odd roles: the backend judges; bytes here
                pass
        return list(json.dumps(messages).encode())


def request_of(body: dict, chat: bool, codec: PromptCodec, arrival: float, default_max_tokens: int) -> Request:
    """What the router plugin sees of ``body``: prompt ids, ``max_tokens`` (``max_completion_tokens``
    first; the backends' default when absent), ``user`` as ``client_id``, ``cache_salt``, ``priority``."""
    ids = codec.chat(body.get("messages", [])) if chat else codec.completion(body.get("prompt", ""))
    max_tokens = body.get("max_completion_tokens") or body.get("max_tokens") or default_max_tokens
    priority = body.get("priority", 0)
    return Request(f"route-{uuid.uuid4().hex}", tuple(ids), int(max_tokens) if isinstance(max_tokens, int) else 1,
                   arrival, priority=priority if isinstance(priority, int) else 0,
                   cache_salt=body.get("cache_salt") if isinstance(body.get("cache_salt"), str) else None,
                   client_id=body.get("user") if isinstance(body.get("user"), str) else None)


class RouteFailure(Exception):
    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code, self.message = code, message


class RouteState:
    """What the handlers share: the backends, the cluster protocol that places requests on them (its
    router plugin: :attr:`router`), the prompt codec and the metrics."""

    def __init__(self, pool: BackendPool, router: Router, router_name: str, codec: PromptCodec,
                 metrics: RouteMetrics, retries: int = 1, default_max_tokens: int = 16) -> None:
        self.pool, self.router_name, self.codec, self.metrics = pool, router_name, codec, metrics
        self.retries, self.default_max_tokens = retries, default_max_tokens
        for b in pool.backends:
            b.checks_length = codec.exact  # the router counts prompts as the backends do
        self.protocol: ClusterProtocol[Backend] = ClusterProtocol(pool.backends, router)
        self.started = time.monotonic()
        self.pool.on_health = lambda b: self.metrics.up.labels(b.url).set(1 if b.up else 0)

    @property
    def router(self) -> Router:
        return self.protocol.router

    def choose(self, request: Request, tried: set[int]) -> Backend:
        """The plugin's placement (checked) among the backends not yet tried; :class:`RouteFailure`
        when none can take it or the plugin fails."""
        backends, draining = self.pool.backends, self.protocol.draining
        try:
            backend = self.protocol.route(request, backends, time.monotonic() - self.started,
                                          exclude=tried | draining)
        except RouterError as exc:  # the plugin's fault, reported; the router keeps serving
            self.metrics.router_errors.labels(self.router_name).inc()
            raise RouteFailure(500, str(exc)) from None
        if backend is None:
            left = [b for b in backends if b.up and b.index not in tried]
            if any(b.index not in draining for b in left):
                raise RouteFailure(400, f"prompt: {request.prompt_len} tokens + max_tokens {request.max_tokens} "
                                   "exceed every backend's max_model_len")
            if left:
                raise RouteFailure(503, "every backend that is up is draining (POST /admin/undrain?backend=<url> "
                                   "takes one back): " + ", ".join(b.url for b in left))
            raise RouteFailure(503, "no backend is up to take the request" + (" (tried: " + ", ".join(
                backends[i].url for i in sorted(tried)) + ")" if tried else ""))
        self.protocol.place(backend, request)
        self.metrics.decisions.labels(self.router_name, backend.url).inc()
        self.metrics.in_flight.labels(backend.url).inc()
        return backend

    def finish(self, request: Request, backend: Backend, outcome: str, received: float) -> None:
        """The request left ``backend``: the counts, the metrics and the plugin's ``on_finish``."""
        self.protocol.end(backend, request)
        self.metrics.in_flight.labels(backend.url).dec()
        drain.ended(self, backend)
        self.metrics.requests.labels(backend.url, outcome).inc()
        if outcome == "ok":
            self.metrics.latency.labels(backend.url).observe(time.monotonic() - received)
        try:
            self.protocol.finished(request, backend.index)
        except Exception as exc:  # noqa: BLE001 - logged and counted; the answer is already on its way
            self.metrics.router_errors.labels(self.router_name).inc()
            log.warning("router plugin %r failed in on_finish(%s): %s: %s", self.router_name, request.id,
                        type(exc).__name__, exc)


def build_route_app(state: RouteState) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI):
        await state.pool.start()
        try:
            yield
        finally:
            await state.pool.stop()

    app = FastAPI(title="servelab route", docs_url=None, redoc_url=None, openapi_url=None, lifespan=lifespan)
    app.state.route = state

    @app.get("/health")
    async def health():
        up = [b.url for b in state.pool.backends if b.up]
        if not up:
            return JSONResponse({"status": "error", "error": "no backend is up"}, status_code=503)
        return {"status": "ok", "backends_up": len(up), "backends": len(state.pool.backends)}

    @app.get("/metrics")
    async def metrics():
        return Response(state.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models(request: HTTPRequest):
        assert state.pool.client is not None
        # a draining backend answers last: it may be about to restart
        for b in sorted(state.pool.backends, key=lambda b: b.index in state.protocol.draining):
            if b.up:
                try:
                    answer = await state.pool.client.get(f"{b.url}/v1/models", headers=_forwarded(request))
                    return Response(answer.content, answer.status_code, media_type="application/json")
                except httpx.HTTPError:
                    state.pool.mark_down(b)
        return _error(503, "no backend is up")

    @app.post("/v1/completions")
    async def completions(request: HTTPRequest):
        return await _proxy(state, request, "/v1/completions", chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: HTTPRequest):
        return await _proxy(state, request, "/v1/chat/completions", chat=True)

    drain.add_admin_routes(app, state)
    return app


def _error(code: int, message: str) -> JSONResponse:
    return JSONResponse(error_body(message, code), status_code=code)


def _forwarded(request: HTTPRequest) -> dict[str, str]:
    return {k: v for k, v in request.headers.items() if k.lower() not in HOP_HEADERS}


async def _proxy(state: RouteState, request: HTTPRequest, path: str, chat: bool):
    received = time.monotonic()
    raw = await request.body()
    try:
        body = json.loads(raw)
        if not isinstance(body, dict):
            raise ValueError("not a JSON object")
    except ValueError as exc:
        return _error(400, f"request body: not a JSON object ({exc})")
    routed = request_of(body, chat, state.codec, received - state.started, state.default_max_tokens)
    headers = _forwarded(request)
    tried: set[int] = set()
    while True:
        try:
            backend = state.choose(routed, tried)
        except RouteFailure as failure:
            return _error(failure.code, failure.message)
        tried.add(backend.index)
        try:
            if body.get("stream"):
                return await _stream(state, request, backend, routed, path, raw, headers, received)
            return await _whole(state, request, backend, routed, path, raw, headers, received)
        except _Retry as retry:
            if len(tried) > state.retries:
                return _error(502, f"backend {backend.url} failed before answering: {retry} "
                              f"(tried {len(tried)} backends; route.retries={state.retries})")
            state.metrics.retries.inc()


class _Retry(Exception):
    """The backend failed before anything reached the client: another one may take the request."""


def _failed(state: RouteState, backend: Backend, request: Request, kind: str, exc: Exception, received: float):
    state.metrics.errors.labels(backend.url, kind).inc()
    state.finish(request, backend, "error", received)
    if kind == "connect":
        state.pool.mark_down(backend)
    return _Retry(f"{type(exc).__name__}: {exc}" if kind != "status" else str(exc))


async def _whole(state: RouteState, request: HTTPRequest, backend: Backend, routed: Request, path: str, raw: bytes,
                 headers: dict, received: float):
    """One JSON answer; a client that leaves meanwhile cancels the upstream call (closing its connection)."""
    assert state.pool.client is not None
    call = asyncio.create_task(state.pool.client.post(backend.url + path, content=raw, headers=headers))
    try:
        while True:
            done, _ = await asyncio.wait({call}, timeout=0.5)
            if done:
                break
            if await request.is_disconnected():
                call.cancel()
                await asyncio.gather(call, return_exceptions=True)
                state.finish(routed, backend, "cancelled", received)
                return Response(status_code=499)
        answer = call.result()
    except httpx.HTTPError as exc:
        raise _failed(state, backend, routed, "connect", exc, received) from None
    except asyncio.CancelledError:
        call.cancel()
        state.finish(routed, backend, "cancelled", received)
        raise
    if answer.status_code in (502, 503, 504):  # busy or a proxy's failure: nothing was computed
        raise _failed(state, backend, routed, "status", RuntimeError(f"HTTP {answer.status_code}"), received)
    if answer.status_code >= 500:
        state.metrics.errors.labels(backend.url, "status").inc()
    state.metrics.first_byte.labels(backend.url).observe(time.monotonic() - received)
    state.finish(routed, backend, "ok" if answer.status_code < 500 else "error", received)
    return Response(answer.content, answer.status_code, media_type=answer.headers.get("content-type"))


async def _stream(state: RouteState, request: HTTPRequest, backend: Backend, routed: Request, path: str, raw: bytes,
                  headers: dict, received: float):
    """Server-sent events passed through as they come. The first chunk is read before answering, so a
    backend that fails before it can still be replaced."""
    client = state.pool.client
    assert client is not None
    try:
        answer = await client.send(client.build_request("POST", backend.url + path, content=raw, headers=headers),
                                   stream=True)
    except httpx.HTTPError as exc:
        raise _failed(state, backend, routed, "connect", exc, received) from None
    if answer.status_code != 200:
        content = await answer.aread()
        await answer.aclose()
        if answer.status_code in (502, 503, 504):
            raise _failed(state, backend, routed, "status", RuntimeError(f"HTTP {answer.status_code}"), received)
        if answer.status_code >= 500:
            state.metrics.errors.labels(backend.url, "status").inc()
        state.finish(routed, backend, "ok" if answer.status_code < 500 else "error", received)
        return Response(content, answer.status_code, media_type=answer.headers.get("content-type"))
    chunks = answer.aiter_raw()
    try:
        first = await chunks.__anext__()
    except StopAsyncIteration:
        first = b""
    except httpx.HTTPError as exc:
        await answer.aclose()
        raise _failed(state, backend, routed, "stream", exc, received) from None
    state.metrics.first_byte.labels(backend.url).observe(time.monotonic() - received)
    return StreamingResponse(_relay(state, backend, routed, answer, first, chunks, received),
                             media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


async def _relay(state: RouteState, backend: Backend, routed: Request, answer: httpx.Response, first: bytes,
                 chunks: AsyncIterator[bytes], received: float):
    """Starlette cancels this generator when the client leaves: closing ``answer`` then closes the
    upstream connection, and the backend aborts the request."""
    outcome, tail = "cancelled", first[-16:]
    try:
        if first:
            yield first
        try:
            async for chunk in chunks:
                tail = (tail + chunk)[-16:]
                yield chunk
            outcome = "ok"
        except httpx.HTTPError as exc:
            outcome = "error"
            state.metrics.errors.labels(backend.url, "stream").inc()
            message = f"backend {backend.url} failed mid-stream: {type(exc).__name__}: {exc}"
            yield f"\n\ndata: {json.dumps(error_body(message, 502))}\n\ndata: [DONE]\n\n".encode()
    finally:
        await answer.aclose()
        if outcome == "cancelled" and b"[DONE]" in tail:  # the client left after the last event: answered
            outcome = "ok"
        state.finish(routed, backend, outcome, received)
