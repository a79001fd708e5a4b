"""Inter-token latencies derived from token times (servelab.results.itl), the spilling token-time
column (servelab.results.spill) and ``results.requests_format=stats``: the summary's ITL figures stay
numpy's exact ones however the values are held, and a stats-format run differs from a jsonl one only
in each line's ITL field."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from servelab.api import compose
from servelab.cli import compare
from servelab.core.errors import ConfigError
from servelab.results import spill
from servelab.results.fairness import record_token_times
from servelab.results.itl import itl_figures, pairwise_sum, percentile_of_sorted, request_itl_stats
from servelab.results.metrics import stats
from servelab.results.spill import SpillingFloats
from servelab.run.session import run_job

SIM = ("backend=sim", "hardware=h100", "model=llama3_8b", "max_model_len=2048", "workload.num_requests=20",
       "workload.rate=20")


def _itls(rng, n: int) -> np.ndarray:  # microsecond-rounded gaps with repeats, a long tail and zeros
    gaps = rng.exponential(20, n) * rng.choice([0, 1, 1, 1, 40], n)
    return np.round(gaps, 3)


@pytest.mark.parametrize("seed", range(6))
def test_itl_figures_are_numpys_exactly_when_spilled(seed):
    rng = np.random.default_rng(seed)
    values = _itls(rng, int(rng.integers(1, 3000)))
    batches = np.array_split(values, int(rng.integers(1, 12)))
    for limit in (7, 100, 10_000):  # spilled to a file, and not
        assert itl_figures(iter(batches), limit, stats) == stats(values)


def test_pairwise_sum_replays_numpys_sum_bit_for_bit():
    values = np.random.default_rng(1).random(100_003) * 1e3
    assert pairwise_sum(lambda a, b: values[a:b], 0, values.size, 1000) == np.add.reduce(values)


def test_spilling_column_reads_any_range_across_file_and_memory():
    column, expected = SpillingFloats(memory_limit=10), np.arange(57, dtype=float) / 7
    for part in np.array_split(expected, 9):
        column.extend(part)
    assert column.spilled and len(column) == 57
    for start, stop in ((0, 57), (3, 41), (50, 57), (9, 10), (20, 20)):
        assert np.array_equal(column.read(start, stop), expected[start:stop])


def test_request_itl_stats_match_numpy_to_the_microsecond():
    rng = np.random.default_rng(3)
    for n in (1, 2, 3, 37, 200):
        gaps = _itls(rng, n)
        assert [percentile_of_sorted(sorted(gaps.tolist()), q) for q in (50, 90, 99)] == np.percentile(gaps, [50, 90, 99]).tolist()
        p50, p90, p99 = np.percentile(gaps, [50, 90, 99])
        assert request_itl_stats(gaps) == {"mean": round(math.fsum(gaps) / n, 3), "p50": round(float(p50), 3),
                                           "p90": round(float(p90), 3), "p99": round(float(p99), 3),
                                           "max": float(gaps.max())}
    assert request_itl_stats(np.zeros(0)) is None


def test_token_times_of_a_stats_record_span_its_first_to_last_token():
    rec = {"arrival_s": 1.0, "ttft_ms": 100.0, "e2e_ms": 400.0, "output_len": 4, "itl_ms_stats": {}}
    assert np.allclose(record_token_times(rec), [1.1, 1.2, 1.3, 1.4])


def _run(tmp_path, name: str, *overrides: str):
    out = tmp_path / name
    run_job(compose([*SIM, *overrides], logger="none", progress=False), out)
    lines = [json.loads(line) for line in (out / "requests.jsonl").read_text().splitlines()]
    return (out / "summary.json").read_text(), lines


def test_stats_format_changes_only_each_lines_itl_field(tmp_path, monkeypatch, capsys):
    summary, lines = _run(tmp_path, "jsonl")
    stats_summary, stats_lines = _run(tmp_path, "stats", "results.requests_format=stats")
    monkeypatch.setattr(spill, "MEMORY_LIMIT", 50)  # the token times and the ITLs in temporary files
    spilled_summary, spilled_lines = _run(tmp_path, "spilled")
    assert stats_summary == summary == spilled_summary and spilled_lines == lines
    assert [list(r) for r in stats_lines] == [[k.replace("itl_ms", "itl_ms_stats") if k == "itl_ms" else k for k in r]
                                              for r in lines]
    for full, short in zip(lines, stats_lines):
        assert short.pop("itl_ms_stats") == request_itl_stats(np.asarray(full.pop("itl_ms"), dtype=float))
        assert short == full
    # servelab compare reads summary.json: the two formats side by side, labelled by the key, the same figures
    compare.main([str(tmp_path / "jsonl"), str(tmp_path / "stats"), "--format", "csv", "--metrics", "itl_ms.p99"])
    header, *rows = capsys.readouterr().out.splitlines()
    assert header.startswith("results.requests_format,itl_ms.p99")
    assert [r.split(",")[0] for r in rows] == ["jsonl", "stats"] and rows[0].split(",")[1] == rows[1].split(",")[1]


def test_a_bad_requests_format_is_one_line_naming_the_key():
    with pytest.raises(ConfigError, match=r"^results.requests_format=csv: .*jsonl, stats") as info:
        compose([*SIM, "results.requests_format=csv"])
    assert "\n" not in str(info.value)
