"""The FastAPI application of ``servelab serve``: OpenAI's completions and chat completions
(streamed as server-sent events or whole), ``/v1/models``, ``/health`` and ``/metrics``.

A handler validates and tokenizes a request, stamps its arrival (receipt time on the engine's
wall clock), hands it to the engine thread (:class:`servelab.serve.engine_thread.EngineLoop`) and relays
the events that come back. A client that disconnects aborts its request. Bad input gets a 400
naming the field and reaches nothing else.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Optional

from fastapi import FastAPI, Request as HTTPRequest
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse

from servelab.workloads.chat import chat_prompt_ids
from servelab.core.request import Request, SamplingParams
from servelab.serve.engine_thread import EngineLoop, Event, Submission
from servelab.serve.metrics import CONTENT_TYPE_LATEST, ServeMetrics
from servelab.serve.protocol import ChatCompletionRequest, CompletionRequest, error_body, validation_message


class HTTPError(Exception):
    def __init__(self, code: int, message: str, param: Optional[str] = None) -> None:
        super().__init__(message)
        self.code, self.message, self.param = code, message, param


class TextCodec:
    """The checkpoint's tokenizer behind a lock: the engine thread decodes while handlers encode,
    and HF fast tokenizers may refuse concurrent use ("Already borrowed")."""

    def __init__(self, text) -> None:
        self.text = text
        self._lock = threading.Lock()

    @property
    def available(self) -> bool:
        return self.text.available

    def encode(self, prompt: str) -> list[int]:
        with self._lock:
            return list(self.text.encode(prompt, "prompt"))

    def chat(self, messages: list[dict], add_generation_prompt: bool) -> list[int]:
        with self._lock:
            return chat_prompt_ids(self.text.tokenizer, messages, add_generation_prompt)

    def decode(self, token_ids) -> str:
        with self._lock:
            return self.text.decode(token_ids)


@dataclass
class ServeState:
    """What the handlers share: the engine thread, the limits, the tokenizer, the metrics."""

    loop: EngineLoop
    codec: TextCodec
    metrics: ServeMetrics
    model_name: str
    max_model_len: int
    vocab_size: int
    default_max_tokens: int
    api_key: Optional[str] = None
    max_body_bytes: int = 1_000_000
    _clock_started: bool = False
    _clock_lock: threading.Lock = field(default_factory=threading.Lock)

    def now(self) -> float:
        """The receipt time of a request on the engine's clock. The first request restarts that
        clock (nothing runs before it), so the run's time 0 is the first arrival, as in a batch run,
        not the server's start-up."""
        with self._clock_lock:
            if not self._clock_started:
                self.loop.engine.reset_clock()
                self._clock_started = True
            return self.loop.engine.now()


def build_app(state: ServeState) -> FastAPI:
    """The FastAPI app: the gate middleware, error handlers, the info routes and the OpenAI routes."""
    app = FastAPI(title="servelab", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.serve = state
    app.add_middleware(Gate, max_bytes=state.max_body_bytes, api_key=state.api_key,
                       on_refused=state.metrics.refused_request)
    _add_error_handlers(app, state)
    _add_info_routes(app, state)
    _add_completion_routes(app, state)
    return app


def _add_error_handlers(app: FastAPI, state: ServeState) -> None:
    """Invalid bodies and :class:`HTTPError` answer in OpenAI's error shape."""

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: HTTPRequest, exc: RequestValidationError):
        message, param = validation_message(exc.errors())
        return _error(state, 400, message, param)

    @app.exception_handler(HTTPError)
    async def _http_error(request: HTTPRequest, exc: HTTPError):
        return _error(state, exc.code, exc.message, exc.param)


def _add_info_routes(app: FastAPI, state: ServeState) -> None:
    """``/health``, ``/metrics`` (Prometheus) and ``/v1/models``."""

    @app.get("/health")
    async def health():
        if state.loop.error:
            return JSONResponse({"status": "error", "error": state.loop.error}, status_code=503)
        return {"status": "ok"}

    @app.get("/metrics")
    async def metrics():
        return Response(state.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{"id": state.model_name, "object": "model", "created": int(time.time()),
                                            "owned_by": "servelab", "max_model_len": state.max_model_len}]}


def _add_completion_routes(app: FastAPI, state: ServeState) -> None:
    """``/v1/completions`` (a text prompt or token ids) and ``/v1/chat/completions``."""

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: HTTPRequest):
        arrival = state.now()
        _check_common(state, body)
        sub = _submission(state, body, _prompt_ids(state, body.prompt), body.max_tokens, arrival, "cmpl")
        return await _respond(state, request, sub, body, chat=False)

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: HTTPRequest):
        arrival = state.now()
        _check_common(state, body)
        ids = _chat_ids(state, body)
        sub = _submission(state, body, ids, body.requested_max_tokens, arrival, "chatcmpl")
        return await _respond(state, request, sub, body, chat=True)


def _prompt_ids(state: ServeState, prompt) -> list[int]:
    """A completion's prompt as token ids: a text prompt needs the model's tokenizer."""
    if isinstance(prompt, str):
        if not state.codec.available:
            raise HTTPError(400, f"prompt: text needs a tokenizer and model {state.model_name!r} has none; "
                            "send token ids", "prompt")
        if not prompt:
            raise HTTPError(400, "prompt: empty text (a prompt needs at least one token)", "prompt")
        return state.codec.encode(prompt)
    return list(prompt)


def _chat_ids(state: ServeState, body: ChatCompletionRequest) -> list[int]:
    """The chat's messages through the model's chat template, as token ids."""
    if not state.codec.available:
        raise HTTPError(400, f"messages: chat needs a tokenizer and model {state.model_name!r} has none",
                        "messages")
    try:
        messages = [{"role": m.role, "content": m.text()} for m in body.messages]
    except ValueError as exc:
        raise HTTPError(400, f"messages: {exc}", "messages") from None
    return state.codec.chat(messages, body.add_generation_prompt)


class _TooLarge(Exception):
    pass


class Gate:
    """ASGI middleware in front of every route: with an API key, ``/v1/*`` needs
    ``Authorization: Bearer <key>`` (else 401); a request body over ``max_bytes`` gets 413 before
    anything parses it (by its Content-Length, or while a chunked body streams in). Plain ASGI,
    not Starlette's BaseHTTPMiddleware, so streamed responses and disconnects pass through untouched."""

    def __init__(self, app, max_bytes: int, api_key: Optional[str] = None, on_refused=None) -> None:
        self.app, self.max_bytes, self.on_refused = app, max_bytes, on_refused
        self.authorization = f"Bearer {api_key}".encode() if api_key else None

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = dict(scope["headers"])
        if (self.authorization is not None and scope["path"].startswith("/v1")
                and not hmac.compare_digest(headers.get(b"authorization", b""), self.authorization)):
            return await self._refuse(send, 401, "missing or wrong API key (send 'Authorization: Bearer <key>')")
        length = headers.get(b"content-length")
        if length is not None and length.isdigit() and int(length) > self.max_bytes:
            return await self._refuse(send, 413, self._too_large())
        seen, started = 0, False

        async def limited_receive():
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise _TooLarge
            return message

        async def tracking_send(message):
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except _TooLarge:
            if not started:
                await self._refuse(send, 413, self._too_large())

    def _too_large(self) -> str:
        return f"request body larger than serve.max_body_bytes={self.max_bytes}"

    async def _refuse(self, send, code: int, message: str) -> None:
        if self.on_refused is not None:
            self.on_refused(code)
        body = json.dumps(error_body(message, code)).encode()
        await send({"type": "http.response.start", "status": code,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})


# ---- checks -------------------------------------------------------------------------------------
def _error(state: ServeState, code: int, message: str, param: Optional[str] = None) -> JSONResponse:
    state.metrics.refused_request(code)
    return JSONResponse(error_body(message, code, param), status_code=code)


def _check_common(state: ServeState, body) -> None:
    problem = body.neutral_fields_error()
    if problem:
        raise HTTPError(400, f"{problem[0]}: {problem[1]}", problem[0])
    if body.model is not None and body.model != state.model_name:
        raise HTTPError(404, f"model: {body.model!r} is not served here (this server serves "
                        f"{state.model_name!r}; see GET /v1/models)", "model")
    if body.stop_strings() and not state.codec.available:
        raise HTTPError(400, f"stop: stop strings need a tokenizer and model {state.model_name!r} has none", "stop")


def _submission(state: ServeState, body, ids: list[int], max_tokens: Optional[int], arrival: float,
                prefix: str) -> Submission:
    vocab, max_len = state.vocab_size, state.max_model_len
    bad = next((i for i, t in enumerate(ids) if not 0 <= t < vocab), None)
    if bad is not None:
        raise HTTPError(400, f"prompt: token id {ids[bad]} at position {bad} is outside the vocabulary "
                        f"[0, {vocab})", "prompt")
    if len(ids) >= max_len:
        raise HTTPError(400, f"prompt: {len(ids)} tokens leave no room to generate within max_model_len="
                        f"{max_len}", "prompt")
    room = max_len - len(ids)
    param = "max_completion_tokens" if getattr(body, "max_completion_tokens", None) is not None else "max_tokens"
    if max_tokens is None:
        max_tokens = min(state.default_max_tokens, room)
    elif max_tokens > room:
        raise HTTPError(400, f"{param}: {max_tokens} + the prompt's {len(ids)} tokens exceed max_model_len="
                        f"{max_len} (at most {room} here)", param)
    top_k = body.top_k if body.top_k is not None and body.top_k > 0 else 0
    sampling = SamplingParams(1.0 if body.temperature is None else float(body.temperature),
                              1.0 if body.top_p is None else float(body.top_p), top_k, body.seed)
    request = Request(f"{prefix}-{uuid.uuid4().hex}", tuple(ids), max_tokens, arrival, sampling, body.ignore_eos,
                      body.priority, body.ttft_slo_ms, body.tpot_slo_ms, body.cache_salt,
                      client_id=body.user or None)  # OpenAI's end-user id: who fair sharing shares between
    reason = state.loop.engine.rejection_reason(request)  # e.g. larger than the whole KV pool
    if reason:
        raise HTTPError(400, f"{param}: the request can never run here: {reason}", param)
    return Submission(request, asyncio.get_running_loop(), asyncio.Queue(), body.stop_strings())


# ---- responses ----------------------------------------------------------------------------------
async def _respond(state: ServeState, request: HTTPRequest, sub: Submission, body, chat: bool):
    refusal = state.loop.submit(sub)
    if refusal:
        raise HTTPError(503, refusal)
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return StreamingResponse(_stream(state, sub, chat, include_usage, body.return_token_ids),
                                 media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
    return await _whole(state, request, sub, chat, body.return_token_ids)


async def _whole(state: ServeState, request: HTTPRequest, sub: Submission, chat: bool, token_ids: bool):
    """Collect every event, then answer once; a client that leaves meanwhile aborts the request."""
    text, ids, done = [], [], None
    try:
        while done is None:
            try:
                event = await asyncio.wait_for(sub.events.get(), timeout=0.5)
            except asyncio.TimeoutError:
                if await request.is_disconnected():
                    return Response(status_code=499)
                continue
            _raise_if_failed(event)
            text.append(event.text)
            ids.extend(event.token_ids)
            if event.finish_reason is not None:
                done = event
    finally:
        if done is None:
            state.loop.cancel(sub.request.id)
    content = "".join(text)
    choice = ({"index": 0, "message": {"role": "assistant", "content": content}} if chat
              else {"index": 0, "text": content})
    choice.update(logprobs=None, finish_reason=done.finish_reason)
    if token_ids:
        choice["token_ids"] = ids
    return {"id": sub.request.id, "object": "chat.completion" if chat else "text_completion",
            "created": int(time.time()), "model": state.model_name, "choices": [choice], "usage": _usage(done)}


async def _stream(state: ServeState, sub: Submission, chat: bool, include_usage: bool, token_ids: bool):
    """Server-sent events, one per engine step that produced text, ending with ``data: [DONE]``.
    Starlette cancels this generator when the client disconnects: the request is then aborted."""
    rid, created = sub.request.id, int(time.time())
    kind = "chat.completion.chunk" if chat else "text_completion"
    done = None

    def chunk(event: Event | None, first: bool = False) -> str:
        choice: dict[str, Any]
        if chat:
            delta = ({"role": "assistant", "content": ""} if first or event is None
                     else {"content": event.text} if event.text else {})
            choice = {"index": 0, "delta": delta}
        else:
            choice = {"index": 0, "text": event.text if event else ""}
        choice.update(logprobs=None, finish_reason=event.finish_reason if event else None)
        if token_ids and event is not None:
            choice["token_ids"] = event.token_ids
        payload: dict[str, Any] = {"id": rid, "object": kind, "created": created, "model": state.model_name,
                                   "choices": [choice]}
        if include_usage:
            payload["usage"] = None
        return f"data: {json.dumps(payload)}\n\n"

    try:
        if chat:
            yield chunk(None, first=True)
        while done is None:
            event = await sub.events.get()
            if event.error is not None:
                done = event
                yield f"data: {json.dumps(error_body(_failure_message(event), 500 if event.finish_reason == 'error' else 400))}\n\n"
                break
            if event.finish_reason is not None:
                done = event
            if event.text or event.token_ids or event.finish_reason is not None:
                yield chunk(event)
        if include_usage and done is not None and done.error is None:
            usage = {"id": rid, "object": kind, "created": created, "model": state.model_name, "choices": [],
                     "usage": _usage(done)}
            yield f"data: {json.dumps(usage)}\n\n"
        yield "data: [DONE]\n\n"
    finally:
        if done is None:  # the client left (or the server gave up on it): abort in the engine
            state.loop.cancel(rid)


def _usage(event: Event) -> dict:
    return {"prompt_tokens": event.prompt_tokens, "completion_tokens": event.completion_tokens,
            "total_tokens": event.prompt_tokens + event.completion_tokens}


def _failure_message(event: Event) -> str:
    if event.finish_reason == "rejected":
        return f"the engine rejected the request: {event.error}"
    return f"the engine failed: {event.error}"


def _raise_if_failed(event: Event) -> None:
    if event.error is not None:
        raise HTTPError(400 if event.finish_reason == "rejected" else 500, _failure_message(event))
