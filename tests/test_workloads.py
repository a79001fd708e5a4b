"""Workloads: synthetic, jsonl and trace (both CSV forms), with their errors."""

from __future__ import annotations

import json

import pytest

from conftest import REPO, compose
from servelab.workloads.build import WorkloadError, build_requests

DATA = REPO / "tests" / "data"


def _reqs(*overrides, vocab=100, max_model_len=2048):
    return build_requests(compose(*overrides).workload, vocab, max_model_len)


def test_synthetic_is_seeded_and_follows_the_distributions():
    a = _reqs("workload.num_requests=50", "workload.prompt_len.min=5", "workload.prompt_len.max=9")
    b = _reqs("workload.num_requests=50", "workload.prompt_len.min=5", "workload.prompt_len.max=9")
    assert [r.prompt_token_ids for r in a] == [r.prompt_token_ids for r in b]
    assert all(5 <= r.prompt_len <= 9 and r.ignore_eos for r in a)
    arrivals = [r.arrival_time for r in a]
    assert arrivals == sorted(arrivals) and arrivals[0] == 0 and arrivals[-1] > 0
    c = _reqs("workload.num_requests=5", "workload.arrival=all_at_once", "workload.output_len.dist=fixed",
              "workload.output_len.mean=7", "seed=3")
    assert all(r.arrival_time == 0 and r.max_tokens == 7 for r in c)
    assert [r.prompt_token_ids for r in c] != [r.prompt_token_ids for r in a[:5]]
    d = _reqs("workload.num_requests=200", "workload.prompt_len.dist=lognormal", "workload.prompt_len.mean=40",
              "workload.prompt_len.max=1000")
    assert 25 < sorted(r.prompt_len for r in d)[100] < 60


def test_jsonl_requests(tmp_path):
    path = tmp_path / "w.jsonl"
    lines = [{"id": "a", "prompt_token_ids": [1, 2, 3], "max_tokens": 4, "arrival_time": 0.5, "priority": 2,
              "ttft_slo_ms": 100, "tpot_slo_ms": 20},
             {"prompt_len": 7, "max_tokens": 2, "ignore_eos": False}]
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n\n")
    a, b = _reqs("workload=jsonl", f"workload.path={path}")
    assert (a.id, a.prompt_token_ids, a.max_tokens, a.arrival_time, a.priority, a.ttft_slo_ms, a.tpot_slo_ms) == \
        ("a", (1, 2, 3), 4, 0.5, 2, 100.0, 20.0)
    assert a.ignore_eos and not b.ignore_eos and b.prompt_len == 7 and b.id == "req-1"


@pytest.mark.parametrize("line,message", [
    ("{not json", r":1: not valid JSON"),
    ('{"prompt_len": 3}', r":1: missing 'max_tokens'"),
    ('{"max_tokens": 3}', r":1: needs 'prompt', 'prompt_token_ids' or 'prompt_len'"),
    ('{"prompt_token_ids": "abc", "max_tokens": 3}', r":1: 'prompt_token_ids' must be a list of integers"),
    ('{"prompt_len": 3, "max_tokens": 3, "colour": 1}', r":1: unknown keys \['colour'\]"),
    ('[1, 2]', r":1: expected a JSON object"),
])
def test_jsonl_errors_name_file_and_line(tmp_path, line, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(line + "\n")
    with pytest.raises(WorkloadError, match=str(path).replace(".", r"\.") + message):
        _reqs("workload=jsonl", f"workload.path={path}")


def test_missing_workload_file_names_the_key(tmp_path):
    with pytest.raises(WorkloadError, match=r"workload.path=.*no such file"):
        _reqs("workload=jsonl", f"workload.path={tmp_path}/nope.jsonl")


def test_azure_trace_with_logged_transformations(caplog):
    caplog.set_level("INFO")
    reqs = _reqs("workload=trace", f"workload.path={DATA / 'azure_sample.csv'}", "workload.length_scale=0.5",
                 max_model_len=1024)
    assert [r.prompt_len for r in reqs] == [187, 198, 440, 6]
    assert [r.max_tokens for r in reqs[:2]] == [22, 54]
    assert reqs[2].prompt_len + reqs[2].max_tokens <= 1024  # clipped, not dropped
    assert [round(r.arrival_time, 3) for r in reqs] == [0.0, 4.315, 4.551, 6.419]
    assert "1 requests clipped to max_model_len=1024" in caplog.text and "using 4 of 4 rows" in caplog.text


def test_arrived_at_trace_and_sampling():
    reqs = _reqs("workload=trace", f"workload.path={DATA / 'arrived_at_sample.csv'}", "workload.num_requests=2")
    assert [(r.prompt_len, r.max_tokens, r.arrival_time) for r in reqs] == [(100, 20, 0.0), (40, 10, 0.5)]
    picked = _reqs("workload=trace", f"workload.path={DATA / 'arrived_at_sample.csv'}", "workload.num_requests=2",
                   "workload.sample=random")
    assert len(picked) == 2


def test_unrecognised_trace_columns(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("a,b\n1,2\n")
    with pytest.raises(WorkloadError, match="unrecognised trace columns"):
        _reqs("workload=trace", f"workload.path={path}")


def test_real_azure_conversation_trace_loads():
    reqs = _reqs("workload=trace", "workload.path=azure_conv",
                 "workload.num_requests=100", "workload.length_scale=0.1", max_model_len=512)
    assert len(reqs) == 100 and all(r.prompt_len + r.max_tokens <= 512 for r in reqs)
    assert reqs[-1].arrival_time > 0


# --- the packaged traces (framework/data/traces): selected by name, shipped with the package ----

def test_every_packaged_trace_loads_by_name():
    from servelab.core.packaged import PACKAGED_TRACES

    assert set(PACKAGED_TRACES) == {"azure_code", "azure_conv", "mooncake_conv", "sharegpt_lengths"}
    assert all(p.is_file() for p in PACKAGED_TRACES.values())
    code = _reqs("workload=trace", "workload.path=azure_code", "workload.num_requests=50", max_model_len=8192)
    assert len(code) == 50 and code[0].prompt_len == 4808 and code[-1].arrival_time > 0  # its first row
    lengths = _reqs("workload=trace", "workload.path=sharegpt_lengths", "workload.num_requests=50",
                    "workload.rate=10", max_model_len=16384)  # lengths alone: Poisson arrivals
    assert len(lengths) == 50 and (lengths[0].prompt_len, lengths[0].max_tokens) == (74, 918)
    assert 0 < lengths[-1].arrival_time < 20
    mooncake = _reqs("workload=hash_ids", "workload.num_requests=5")  # the default path: mooncake_conv
    assert compose("workload=hash_ids").workload.path == "mooncake_conv" and len(mooncake) == 5


def test_an_unknown_trace_name_lists_the_names():
    for workload in ("trace", "hash_ids"):
        with pytest.raises(WorkloadError) as err:
            _reqs(f"workload={workload}", "workload.path=azure_chat")
        assert str(err.value) == ("workload.path='azure_chat': no such file, and not a packaged trace "
                                  "(names: azure_code, azure_conv, mooncake_conv, sharegpt_lengths)")


@pytest.mark.parametrize("preset", ["slo_goodput_trace", "block_size_sweep", "paged_vs_contiguous",
                                    "prefix_caching_trace"])
def test_trace_presets_read_a_packaged_trace(preset):
    from servelab.api import compose as compose_as_run  # as `python run.py experiment=...` composes it
    from servelab.core.packaged import PACKAGED_TRACES

    cfg = compose_as_run([f"experiment={preset}", "workload.num_requests=20"], logger="none")
    assert cfg.workload.path in PACKAGED_TRACES
    assert len(build_requests(cfg.workload, 4096, cfg.max_model_len)) == 20


def test_the_package_data_globs_ship_the_traces():
    import fnmatch
    import tomllib

    globs = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]["servelab"]
    folder = REPO / "framework" / "data" / "traces"
    files = [p.relative_to(REPO / "framework").as_posix() for p in folder.iterdir()]
    assert {"data/traces/README.md", "data/traces/LICENSE-Apache-2.0.txt"} <= set(files)
    assert all(any(fnmatch.fnmatch(f, g) for g in globs) for f in files), files
