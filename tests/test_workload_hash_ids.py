"""The hash_ids workload: prompts share token ids exactly where the trace shares blocks."""

from __future__ import annotations

import json

import pytest
from omegaconf import OmegaConf

from servelab.core.packaged import PACKAGED_TRACES
from servelab.config import HashIdsWorkload
from servelab.workloads.build import WorkloadError, build_requests

TRACE = PACKAGED_TRACES["mooncake_conv"]  # shipped in the package (framework/data/traces)


def cfg(path, **kw):
    node = OmegaConf.structured(HashIdsWorkload(path=str(path), seed=0, **kw))
    return node


def write(tmp_path, rows):
    path = tmp_path / "trace.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_shared_hash_ids_give_shared_tokens(tmp_path):
    path = write(tmp_path, [
        {"timestamp": 0, "input_length": 1500, "output_length": 64, "hash_ids": [1, 2, 3]},
        {"timestamp": 500, "input_length": 1100, "output_length": 32, "hash_ids": [1, 2, 9]},
        {"timestamp": 1000, "input_length": 600, "output_length": 32, "hash_ids": [4, 2]},
    ])
    reqs = build_requests(cfg(path, block_tokens=16), vocab_size=4096, max_model_len=2048)
    a, b, c = (r.prompt_token_ids for r in reqs)
    assert [len(a), len(b), len(c)] == [47, 34, 19]  # input_length x 16/512, rounded
    assert a[:32] == b[:32] and a[32:34] != b[32:34]
    assert c[:16] != a[:16] and c[16:19] == a[16:19]  # same block id 2 -> same tokens (prefix differs)
    assert [r.max_tokens for r in reqs] == [2, 1, 1]
    assert [r.arrival_time for r in reqs] == [0.0, 0.5, 1.0]
    again = build_requests(cfg(path, block_tokens=16), vocab_size=4096, max_model_len=2048)
    assert [r.prompt_token_ids for r in again] == [r.prompt_token_ids for r in reqs]


def test_bad_rows_name_the_file_and_line(tmp_path):
    path = write(tmp_path, [{"timestamp": 0, "input_length": 1500, "output_length": 4}])
    with pytest.raises(WorkloadError, match=r"trace.jsonl:1"):
        build_requests(cfg(path), 4096, 2048)
    short = write(tmp_path, [{"timestamp": 0, "input_length": 5000, "output_length": 4, "hash_ids": [1]}])
    with pytest.raises(WorkloadError, match="cannot cover"):
        build_requests(cfg(short), 4096, 2048)
    with pytest.raises(WorkloadError, match="workload.path"):
        build_requests(cfg(tmp_path / "missing.jsonl"), 4096, 2048)


def test_clipped_to_max_model_len(tmp_path):
    path = write(tmp_path, [{"timestamp": 0, "input_length": 5120, "output_length": 512, "hash_ids": list(range(10))}])
    (req,) = build_requests(cfg(path, block_tokens=32), 4096, max_model_len=256)
    assert req.prompt_len + req.max_tokens <= 256 and req.prompt_len == 255


def test_the_mooncake_trace_shares_first_blocks():
    reqs = build_requests(cfg("mooncake_conv", num_requests=20, block_tokens=8), 4096, 4096)
    rows = [json.loads(line) for line in TRACE.open().readlines()[:20]]
    for r, row in zip(reqs, rows):
        if row["hash_ids"][0] == rows[0]["hash_ids"][0]:
            assert r.prompt_token_ids[:8] == reqs[0].prompt_token_ids[:8]
