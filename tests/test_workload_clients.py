"""Clients of a workload: ``workload.clients`` (shares, rates, per-client lengths) on the generated and
replayed workloads, ``client_id`` in jsonl files, and their one-line errors."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from conftest import compose
from servelab.core.errors import ConfigError
from servelab.workloads.build import WorkloadError, build_requests
from servelab.workloads.text_prompts import prompts_requests

RATES = "workload.clients=[{id:a,rate:2},{id:b,rate:20}]"
SHARES = "workload.clients=[{id:a,share:1},{id:b,share:3}]"


def _reqs(*overrides, vocab=100, max_model_len=2048):
    return list(build_requests(compose(*overrides).workload, vocab, max_model_len))


def _shape(requests):
    return [(r.id, r.prompt_token_ids, r.max_tokens, r.ignore_eos) for r in requests]


def test_no_clients_by_default():
    assert compose().workload.clients is None
    assert {r.client_id for r in _reqs("workload.num_requests=20")} == {None}


def test_shares_split_the_requests_and_keep_the_workload():
    plain = _reqs("workload.num_requests=2000")
    shared = _reqs("workload.num_requests=2000", SHARES)
    assert _shape(shared) == _shape(plain)
    assert [r.arrival_time for r in shared] == [r.arrival_time for r in plain]  # one stream at workload.rate
    fraction_a = np.mean([r.client_id == "a" for r in shared])
    assert 0.22 < fraction_a < 0.28  # 1 / (1 + 3)
    assert [r.client_id for r in _reqs("workload.num_requests=2000", SHARES)] == [r.client_id for r in shared]
    assert [r.client_id for r in _reqs("workload.num_requests=2000", SHARES, "seed=1")] != \
        [r.client_id for r in shared]


def test_rates_are_per_client_poisson_streams_merged():
    plain = _reqs("workload.num_requests=2000")
    rated = _reqs("workload.num_requests=2000", RATES)
    assert _shape(rated) == _shape(plain) and len(rated) == 2000  # num_requests in all
    # the same gaps, rescaled from workload.rate (8/s) to the summed rate (22/s)
    np.testing.assert_allclose([r.arrival_time for r in rated], np.array([r.arrival_time for r in plain]) * 8 / 22)
    arrivals = np.array([r.arrival_time for r in rated])
    owners = np.array([r.client_id for r in rated])
    assert 0.07 < np.mean(owners == "a") < 0.11  # 2 / 22
    for client, rate in (("a", 2.0), ("b", 20.0)):  # each client's own stream runs at its rate
        mine = arrivals[owners == client]
        assert (len(mine) - 1) / (mine[-1] - mine[0]) == pytest.approx(rate, rel=0.15)


def test_a_client_with_its_own_lengths_leaves_the_others_alone():
    plain = _reqs("workload.num_requests=300")
    flood = _reqs("workload.num_requests=300",
                  "workload.clients=[{id:flood,share:1,output_len:{dist:fixed,mean:100},"
                  "prompt_len:{min:3,max:5}},{id:calm,share:1}]")
    calm = [(p, f) for p, f in zip(plain, flood) if f.client_id == "calm"]
    flooding = [f for f in flood if f.client_id == "flood"]
    assert calm and flooding
    assert all(p.prompt_token_ids == f.prompt_token_ids and p.max_tokens == f.max_tokens for p, f in calm)
    assert all(f.max_tokens == 100 and 3 <= f.prompt_len <= 5 for f in flooding)


def test_traces_take_shares():
    plain = _reqs("workload=trace", "workload.path=azure_conv", "workload.num_requests=200")
    shared = _reqs("workload=trace", "workload.path=azure_conv", "workload.num_requests=200", SHARES)
    assert _shape(shared) == _shape(plain)
    assert [r.arrival_time for r in shared] == [r.arrival_time for r in plain]
    assert {r.client_id for r in shared} == {"a", "b"} and {r.client_id for r in plain} == {None}
    hashed = _reqs("workload=hash_ids", "workload.num_requests=40", SHARES)
    assert _shape(hashed) == _shape(_reqs("workload=hash_ids", "workload.num_requests=40"))
    assert {r.client_id for r in hashed} == {"a", "b"}


class _Text:
    """A stand-in tokenizer: one token per character."""

    def require(self, what, hint=None):
        pass

    def encode(self, text, where):
        return tuple(ord(c) % 100 for c in text)


def test_text_prompts_take_rates(tmp_path):
    path = tmp_path / "prompts.txt"
    path.write_text("\n".join(f"prompt {i}" for i in range(50)) + "\n")
    cfg = compose("workload=prompts", f"workload.path={path}", "workload.arrival=poisson", RATES).workload
    requests = prompts_requests(cfg, _Text())
    assert {r.client_id for r in requests} == {"a", "b"} and requests[-1].arrival_time > 0
    with pytest.raises(ConfigError, match=r"workload\.clients\[0\]\.rate: workload\.arrival=all_at_once"):
        prompts_requests(compose("workload=prompts", f"workload.path={path}", RATES).workload, _Text())


@pytest.mark.parametrize("overrides, message", [
    (("workload.clients=[{id:a},{id:a}]",), r"^workload\.clients\[1\]\.id='a' repeats workload\.clients\[0\]\.id"),
    (("workload.clients=[{share:1}]",), r"^workload\.clients\[0\]\.id='': every client needs a non-empty string id$"),
    (("workload.clients=[{id:a,share:0}]",), r"^workload\.clients\[0\]\.share=0 must be > 0$"),
    (("workload.clients=[{id:a,rate:-2}]",), r"^workload\.clients\[0\]\.rate=-2 must be > 0$"),
    (("workload.clients=[{id:a,share:1,rate:2}]",), r"^workload\.clients\[0\]: give share or rate, not both$"),
    (("workload.clients=[{id:a,rate:1},{id:b,share:2}]",), r"^workload\.clients\[1\]\.share: mixes rate with share"),
    (("workload.clients=[{id:a,share:1},{id:b}]",), r"^workload\.clients\[1\]\.share/rate: mixes share with neither"),
    (("workload=trace", "workload.path=azure_conv", "workload.clients=[{id:a,rate:1}]"),
     r"^workload\.clients\[0\]\.rate: workload=trace replays the trace's arrival times; give share instead$"),
    (("workload=hash_ids", "workload.clients=[{id:a,rate:1}]"), r"^workload\.clients\[0\]\.rate: workload=hash_ids"),
    (("workload.arrival=all_at_once", "workload.clients=[{id:a,rate:1}]"),
     r"^workload\.clients\[0\]\.rate: workload\.arrival=all_at_once has no rate"),
    (("workload=trace", "workload.path=azure_conv", "workload.clients=[{id:a,output_len:{min:2}}]"),
     r"^workload\.clients\[0\]\.output_len: per-client lengths apply only to workload=synthetic$"),
])
def test_client_mistakes_are_one_line_naming_the_key(overrides, message):
    with pytest.raises(ConfigError, match=message) as err:
        _reqs(*overrides)
    assert "\n" not in str(err.value)


def test_per_client_lengths_are_checked_like_the_workloads():
    with pytest.raises(WorkloadError, match=r"workload\.clients\[0\]\.prompt_len: need 1 <= min <= max"):
        _reqs("workload.clients=[{id:a,prompt_len:{min:9,max:3}}]")


def test_client_entries_are_typed_by_hydra():
    with pytest.raises(Exception, match="colour"):
        compose("workload.clients=[{id:a,colour:red}]")
    assert compose("workload=corpus", SHARES).workload.clients[1].share == 3.0


def test_jsonl_client_id(tmp_path):
    path = tmp_path / "requests.jsonl"
    path.write_text('{"prompt_len": 3, "max_tokens": 2, "client_id": "alice"}\n'
                    '{"prompt_len": 3, "max_tokens": 2, "client_id": null}\n'
                    '{"prompt_len": 3, "max_tokens": 2}\n')
    assert [r.client_id for r in _reqs("workload=jsonl", f"workload.path={path}")] == ["alice", None, None]


@pytest.mark.parametrize("value, shown", [("7", "7 (int)"), ("[1, 2]", "[1, 2] (list)"), ("true", "true (bool)")])
def test_jsonl_client_id_must_be_a_string(tmp_path, value, shown):
    path = tmp_path / "requests.jsonl"
    path.write_text('{"prompt_len": 3, "max_tokens": 2}\n\n' + '{"prompt_len": 3, "max_tokens": 2, "client_id": '
                    + value + "}\n")
    with pytest.raises(WorkloadError, match=f"^{re.escape(f'{path}:3: client_id must be a string, got {shown}')}$"):
        _reqs("workload=jsonl", f"workload.path={path}")
    path.write_text(json.dumps({"prompt_len": 3, "max_tokens": 2, "client_id": ""}) + "\n")
    with pytest.raises(WorkloadError, match=r":1: client_id is empty"):
        _reqs("workload=jsonl", f"workload.path={path}")
