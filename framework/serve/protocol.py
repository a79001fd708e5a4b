"""The OpenAI request bodies ``servelab serve`` accepts, as strict pydantic models.

Unknown fields, wrong types (no coercion: ``"max_tokens": "5"`` is an error) and values out of
range are refused with a 400 whose message names the field. OpenAI fields that servelab does not
implement are accepted only at their neutral value (``n=1``, ``logprobs`` null, penalties 0...).
servelab's extensions ride as extra body fields (``extra_body=`` in the ``openai`` client):
``priority``, ``ttft_slo_ms``, ``tpot_slo_ms``, ``cache_salt``, ``ignore_eos``, ``top_k``,
``return_token_ids``. OpenAI's ``user`` (the end user's id) becomes the request's ``client_id``
(fair-sharing schedulers, the fairness figures; empty = none).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Literal, Optional, Union

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictFloat, StrictInt, StrictStr

Number = Union[StrictInt, StrictFloat]
TokenIds = Annotated[list[StrictInt], Field(min_length=1)]


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid")

    include_usage: StrictBool = False
    continuous_usage_stats: StrictBool = False  # vLLM's: usage on every chunk (accepted, not needed)


class _Common(BaseModel):
    """Sampling, limits and servelab's extensions, shared by both endpoints."""

    model_config = ConfigDict(extra="forbid")

    model: Optional[StrictStr] = None
    max_tokens: Optional[StrictInt] = Field(None, ge=1)
    temperature: Optional[Number] = Field(None, ge=0, le=2)
    top_p: Optional[Number] = Field(None, gt=0, le=1)
    top_k: Optional[StrictInt] = Field(None, ge=-1)  # 0 or -1 = no cut (vLLM uses -1)
    seed: Optional[StrictInt] = Field(None, ge=0, lt=2**63)
    stop: Union[StrictStr, Annotated[list[StrictStr], Field(max_length=16)], None] = None
    stream: StrictBool = False
    stream_options: Optional[StreamOptions] = None
    ignore_eos: StrictBool = False
    # servelab extensions
    priority: StrictInt = 0
    ttft_slo_ms: Optional[Number] = Field(None, gt=0)
    tpot_slo_ms: Optional[Number] = Field(None, gt=0)
    cache_salt: Optional[StrictStr] = None
    return_token_ids: StrictBool = False
    user: Optional[StrictStr] = None  # OpenAI's end-user id: the request's client_id
    # OpenAI fields accepted at their neutral value only (checked by neutral_fields_error)
    n: StrictInt = 1
    presence_penalty: Optional[Number] = 0
    frequency_penalty: Optional[Number] = 0
    logit_bias: Optional[dict] = None
    logprobs: Union[StrictBool, StrictInt, None] = None

    def neutral_fields_error(self) -> Optional[tuple[str, str]]:
        """``(field, message)`` for an OpenAI option set to something servelab does not do."""
        if self.n != 1:
            return "n", "only n=1 is supported (send one request per completion)"
        for name in ("presence_penalty", "frequency_penalty"):
            if getattr(self, name) not in (None, 0):
                return name, f"{name} is not supported (only 0)"
        if self.logit_bias:
            return "logit_bias", "logit_bias is not supported"
        if self.logprobs not in (None, False, 0):
            return "logprobs", "logprobs are not supported"
        if self.stream_options is not None and not self.stream:
            return "stream_options", "stream_options is only allowed with stream=true"
        return None

    def stop_strings(self) -> list[str]:
        if self.stop is None:
            return []
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop)
        return [s for s in stops if s]


class CompletionRequest(_Common):
    """``POST /v1/completions``: ``prompt`` is text or a list of token ids (one prompt per request)."""

    prompt: Union[StrictStr, TokenIds]
    echo: StrictBool = False
    best_of: Optional[StrictInt] = None
    suffix: Optional[StrictStr] = None

    def neutral_fields_error(self) -> Optional[tuple[str, str]]:
        if self.echo:
            return "echo", "echo is not supported"
        if self.best_of not in (None, 1):
            return "best_of", "only best_of=1 is supported"
        if self.suffix:
            return "suffix", "suffix is not supported"
        return super().neutral_fields_error()


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")

    role: Literal["system", "user", "assistant", "developer"]
    content: Union[StrictStr, list[dict]]
    name: Optional[StrictStr] = None

    def text(self) -> str:
        """The content as text (OpenAI's list of parts: text parts joined; others refused)."""
        if isinstance(self.content, str):
            return self.content
        parts = []
        for part in self.content:
            if part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise ValueError("only text content parts ({'type': 'text', 'text': ...}) are supported")
            parts.append(part["text"])
        return "".join(parts)


class ChatCompletionRequest(_Common):
    """``POST /v1/chat/completions``: the messages go through the checkpoint's chat template."""

    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_completion_tokens: Optional[StrictInt] = Field(None, ge=1)
    top_logprobs: Optional[StrictInt] = None
    add_generation_prompt: StrictBool = True  # vLLM's extension

    def neutral_fields_error(self) -> Optional[tuple[str, str]]:
        if self.top_logprobs:
            return "top_logprobs", "logprobs are not supported"
        if self.max_tokens is not None and self.max_completion_tokens is not None:
            return "max_completion_tokens", "give max_tokens or max_completion_tokens, not both"
        return super().neutral_fields_error()

    @property
    def requested_max_tokens(self) -> Optional[int]:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


def error_body(message: str, code: int, param: Optional[str] = None, kind: Optional[str] = None) -> dict:
    """OpenAI's error shape: ``{"error": {"message", "type", "param", "code"}}``."""
    kinds = {400: "BadRequestError", 401: "AuthenticationError", 404: "NotFoundError",
             413: "BadRequestError", 503: "ServiceUnavailableError", 500: "InternalServerError"}
    return {"error": {"message": message, "type": kind or kinds.get(code, "Error"), "param": param, "code": code}}


def validation_message(errors: Sequence[dict]) -> tuple[str, Optional[str]]:
    """One line naming the first offending field, from pydantic/FastAPI validation errors."""
    if not errors:
        return "invalid request", None
    err = errors[0]
    field = _field(err)
    kind = err.get("type", "")
    alternatives = [e for e in errors if _field(e) == field]
    if len(alternatives) > 1 and kind not in ("missing", "extra_forbidden", "json_invalid"):
        # a union (text or token ids; int or float) reports each alternative: say all of them
        hints = "; or ".join(dict.fromkeys(e.get("msg", "") for e in alternatives))
        return f"{field or 'body'}: wrong type or value ({hints})", field
    if kind == "json_invalid":
        return f"malformed JSON: {err.get('msg', '')} ({err.get('ctx', {}).get('error', '')})".rstrip(" ()"), None
    if kind == "extra_forbidden":
        return f"{field}: unknown field", field
    if kind == "missing":
        return f"{field}: field required", field
    return f"{field or 'body'}: {err.get('msg', 'invalid value')}", field


def _field(err: dict) -> Optional[str]:
    """The field an error is about, without pydantic's union-branch steps (``prompt.str``,
    ``prompt.list[int]``, ``temperature.int``)."""
    loc = [str(p) for p in err.get("loc", ()) if p != "body"]
    loc = [p for p in loc if not any(c in p for c in "[]") and p not in ("str", "int", "float", "bool", "list")
           and not p.isdigit()]
    return ".".join(loc) or None
