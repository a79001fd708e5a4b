"""``servelab serve``: OpenAI's ``user`` field becomes the request's ``client_id`` (fair sharing, the
fairness figures). In-process, without a server: the request a handler would hand to the engine."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

pytest.importorskip("fastapi", reason="the serve extra (pip install servelab[serve]) is not installed")

from servelab.serve.app import _submission
from servelab.serve.protocol import ChatCompletionRequest, CompletionRequest

STATE = SimpleNamespace(vocab_size=100, max_model_len=64, default_max_tokens=4,
                        loop=SimpleNamespace(engine=SimpleNamespace(rejection_reason=lambda request: None)))


def _request(body):
    async def submit():
        return _submission(STATE, body, [1, 2, 3], 4, 0.0, "cmpl").request

    return asyncio.run(submit())


@pytest.mark.parametrize("user, client_id", [("alice", "alice"), (None, None), ("", None)])
def test_user_is_the_client_id(user, client_id):
    extra = {} if user is None else {"user": user}
    assert _request(CompletionRequest(prompt=[1, 2, 3], **extra)).client_id == client_id
    chat = ChatCompletionRequest(messages=[{"role": "user", "content": "hi"}], **extra)
    assert _request(chat).client_id == client_id


def test_user_must_be_a_string():
    with pytest.raises(ValueError, match="user"):
        CompletionRequest(prompt=[1], user=7)
