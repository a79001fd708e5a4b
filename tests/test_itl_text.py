"""The fast request-line path (servelab.results.itl_text, itl_micros, the writer's record_line): the
same bytes as ``json.dumps`` of the record ``request_record`` made the slow way, for any token times,
edge values included."""

from __future__ import annotations

import json
from array import array

import numpy as np
import pytest

from servelab.core.request import Request, Sequence, Status
from servelab.results.itl import itl_micros, itl_ms, request_itl_stats
from servelab.results.itl_text import BLOCK, TABLE_LIMIT, ItlText
from servelab.results.metrics import request_record
from servelab.results.writer import record_line


def _reference_itl_ms(token_times) -> np.ndarray:  # what itl_ms was: numpy's diff and round
    return np.round(np.diff(np.asarray(token_times, dtype=float)) * 1e3, 3)


def _times(rng, n: int) -> np.ndarray:
    gaps = rng.exponential(0.03, n) * rng.choice([0, 1, 1, 1, 40], n)  # repeats (same step), long tails, zeros
    return rng.uniform(0, 1e4) + np.cumsum(gaps)


@pytest.mark.parametrize("seed", range(8))
def test_itl_micros_over_1000_is_numpys_diff_and_round_bit_for_bit(seed):
    times = _times(np.random.default_rng(seed), 500)
    for given in (times, times.tolist(), array("d", times)):
        assert itl_ms(given).tobytes() == _reference_itl_ms(times).tobytes()
        assert np.array_equal(itl_micros(given) / 1000.0, _reference_itl_ms(times))
    assert itl_micros([]).size == itl_micros(array("d", [1.0])).size == 0


@pytest.mark.parametrize("values", [
    [], [0.0], [0.0, -0.0, 5.0], [-3.0, 2.0], [float("nan"), 1.0], [float("inf"), 1.0], [1e30, 3.0],
    [TABLE_LIMIT - 1.0, 0.0], [TABLE_LIMIT, 1.0], [BLOCK - 1.0, BLOCK, 7.0, 7.0], [123456.0, 999.0, 1.0]])
def test_itl_text_is_the_repr_of_each_value_edge_values_too(values):
    micros = np.array(values, dtype=float)
    text = ItlText()
    expected = "[" + ", ".join(map(repr, (micros / 1000.0).tolist())) + "]"
    assert text.text(micros) == text.text(micros) == expected  # made, then from the table
    if np.isfinite(micros).all():
        assert expected == json.dumps((micros / 1000.0).tolist())


def test_itl_text_is_json_dumps_of_the_list_for_many_requests():
    rng, text = np.random.default_rng(4), ItlText()
    for _ in range(200):
        micros = itl_micros(_times(rng, int(rng.integers(1, 300))))
        assert text.text(micros) == json.dumps((micros / 1000.0).tolist())


def _sequence(rng, n: int, status=Status.FINISHED) -> Sequence:
    times = _times(rng, n)
    start = float(times[0]) if n else 100.0
    seq = Sequence(Request(id=f"r{n}", prompt_token_ids=(1,) * 7, max_tokens=max(n, 1), arrival_time=start - 0.5))
    seq.output_token_ids = list(range(n))
    seq.token_times = array("d", times)
    seq.first_scheduled_time = start - 0.1 if n else None
    seq._status = status
    seq.finish_reason = "length" if status == Status.FINISHED else None
    return seq


@pytest.mark.parametrize("requests_format", ["jsonl", "stats"])
def test_record_line_from_the_microseconds_is_json_dumps_of_the_record(requests_format):
    rng = np.random.default_rng(5)
    for n in (0, 1, 2, 3, 50, 400):
        seq = _sequence(rng, n, Status.FINISHED if n else Status.WAITING)
        micros = itl_micros(seq.token_times)
        fast = request_record(seq, 1.0, 200.0, 30.0, requests_format, micros, token_ids=False)
        slow = request_record(seq, 1.0, 200.0, 30.0, requests_format)
        slow["output_token_ids"] = None
        assert fast == slow and list(fast) == list(slow)
        itl_key = "itl_ms_stats" if requests_format == "stats" else "itl_ms"
        reference = _reference_itl_ms(seq.token_times)
        if requests_format == "stats":
            assert fast[itl_key] == request_itl_stats(reference)
        else:
            assert fast[itl_key] == reference.tolist()
        assert record_line(fast, micros) == record_line(fast) == json.dumps(slow)
        assert fast.get("itl_ms") == slow.get("itl_ms")  # the record is left as it was


def test_request_itl_stats_keep_sorteds_order_for_signed_zeros_and_nan():
    for gaps in ([0.0, -0.0, 1.0], [-0.0, 0.0], [float("nan"), 2.0, 1.0], [3.0, 1.0, 2.0]):
        values = np.array(gaps)
        ordered = sorted(gaps)
        got = request_itl_stats(values)
        assert repr(got["max"]) == repr(ordered[-1])
