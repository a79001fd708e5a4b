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


_TRICKY = {"id": "r\"1\\\u00e9\n\x00%s", "zero": 0.0, "negative_zero": -0.0, "big": 1e308, "tiny": 5e-324,
           "e16": 1e16, "third": 1 / 3, "nan": float("nan"), "inf": float("inf"), "-inf": float("-inf"),
           "int": 2**70, "-int": -7, "flags": [True, False, None], "nested": {"a": [1.5, {"b": []}], "c": {}},
           "empty": "", "itl_ms": [0.0, -0.0, 14.432, 1048.575, 1048.576, 1e9, float("nan")]}


def test_the_writers_encoder_is_json_dumps_for_tricky_values():
    from servelab.results.writer import _dumps

    assert _dumps(_TRICKY) == json.dumps(_TRICKY)
    assert _dumps({}) == "{}" and _dumps([]) == "[]"
    micros = np.array([0.0, 14432.0, 14432.0, 999.0])
    rec = dict(_TRICKY, itl_ms=(micros / 1000.0).tolist())
    assert record_line(rec, micros) == json.dumps(rec)


@pytest.mark.parametrize("requests_format", ["jsonl", "stats"])
def test_request_writer_lines_are_json_dumps_of_the_record_with_or_without_a_list_reader(tmp_path, requests_format):
    """The writer leaves the ITL list unmade where no listener reads it (``reads_itl_ms = False``):
    the same bytes as where one does, and as ``json.dumps`` of the record made the slow way."""
    from servelab.core.interfaces import EngineLimits
    from servelab.results.writer import RequestWriter, drop_placeholder_tokens

    limits = EngineLimits(16, 8, 512, 4096, True, 200.0, 30.0)
    rng = np.random.default_rng(9)
    seqs = [_sequence(rng, n, Status.FINISHED if n else Status.WAITING) for n in (0, 1, 2, 3, 50, 400)]
    t2, t3 = seqs[2].token_times[0], seqs[3].token_times[0]
    seqs[2].token_times = array("d", [t2, t2 - 1e-10, t2 + 0.5])  # a -0.0 gap: written by repr, not the table
    seqs[3].token_times = array("d", [t3, t3, t3 + 2.0])  # a 0.0 gap and one past the table
    seen: dict[str, list] = {"reads": [], "skips": []}

    def reads(rec):
        seen["reads"].append(rec["itl_ms"] if requests_format == "jsonl" else rec["itl_ms_stats"])

    def skips(rec):
        seen["skips"].append(rec["id"])

    skips.reads_itl_ms = False  # type: ignore[attr-defined]
    texts = []
    for name, listener in (("with", reads), ("without", skips)):
        writer = RequestWriter(tmp_path / f"{name}.jsonl", None, 1.0, decorate=drop_placeholder_tokens,
                               limits=limits, requests_format=requests_format)
        writer.record_listeners.append(listener)
        for seq in seqs:
            writer.on_end(seq)
        writer.close()
        texts.append((tmp_path / f"{name}.jsonl").read_text())
    expected = []
    for seq in seqs:
        slow = request_record(seq, 1.0, 200.0, 30.0, requests_format)
        slow["output_token_ids"] = None
        expected.append(json.dumps(slow) + "\n")
    assert texts[0] == texts[1] == "".join(expected)
    assert len(seen["reads"]) == len(seen["skips"]) == len(seqs)
    if requests_format == "jsonl":
        assert seen["reads"] == [json.loads(line)["itl_ms"] for line in expected]
        assert "-0.0" in expected[2] and "2000.0" in expected[3]
