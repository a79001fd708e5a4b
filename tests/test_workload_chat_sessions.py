"""workload=chat_sessions: conversations whose turns repeat their history over shared system prompts."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from servelab.core.errors import WorkloadError
from servelab.config import ChatSessionsWorkload
from servelab.workloads.build import build_requests


def _requests(max_model_len=8192, **overrides):
    cfg = OmegaConf.structured(ChatSessionsWorkload(seed=3))
    for key, value in overrides.items():
        OmegaConf.update(cfg, key, value)
    return build_requests(cfg, 1000, max_model_len)


def test_each_turn_extends_its_session_prompt_and_sessions_share_system_prompts():
    requests = _requests(num_sessions=40)
    assert [r.arrival_time for r in requests] == sorted(r.arrival_time for r in requests)
    by_session: dict[str, list] = {}
    for r in requests:
        by_session.setdefault(r.client_id, []).append(r)
    for turns in by_session.values():
        turns.sort(key=lambda r: int(r.id.rsplit("-", 1)[1]))
        for prev, nxt in zip(turns, turns[1:]):
            assert nxt.arrival_time > prev.arrival_time
            # the next prompt is the previous prompt, its stored reply, then the new user message
            assert nxt.prompt_token_ids[:prev.prompt_len] == prev.prompt_token_ids
            assert nxt.prompt_len > prev.prompt_len + prev.max_tokens
    firsts = [turns[0].prompt_token_ids[:256] for turns in by_session.values()]
    assert len(set(firsts)) < len(firsts)  # Zipf popularity: some sessions open with the same system prompt


def test_seeded_and_clipped_to_max_model_len():
    assert _requests() == _requests()
    short = _requests(max_model_len=900)
    assert all(r.prompt_len + r.max_tokens <= 900 for r in short)
    assert len(short) < len(_requests())


@pytest.mark.parametrize("key, value", [("session_rate", 0.0), ("think_time_s", -1.0), ("num_system_prompts", 0),
                                        ("system_zipf", -0.5)])
def test_bad_values_name_the_key(key, value):
    with pytest.raises(WorkloadError, match=f"workload.{key}="):
        _requests(**{key: value})


def test_a_model_too_short_for_any_first_turn_is_told_which_lengths_to_shorten():
    with pytest.raises(WorkloadError, match=r"max_model_len=256; shorten workload.system_prompt_len") as info:
        _requests(max_model_len=256)
    assert "system_prompt_len.min=256 now" in str(info.value)
    assert _requests(max_model_len=256, system_prompt_len={"min": 32, "max": 128}, user_len={"max": 64},
                     output_len={"max": 64})  # the suggested lengths fit
