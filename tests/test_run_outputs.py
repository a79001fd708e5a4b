"""What a run prints and refuses (issue 36, item 4): empty workloads, token-id samples, small figures,
the progress lines of a run whose output is not a terminal, prompt and completion told apart in words."""

from __future__ import annotations

import io
import json
import subprocess
import sys

import numpy as np
import pytest
from rich.console import Console

from conftest import REPO, compose
from servelab.core.errors import WorkloadError
from servelab.results.report import _fmt, print_samples, print_summary
from servelab.results.writer import LineProgress, _progress_bar
from servelab.run.session import run_job
from servelab.workloads.build import build_requests
from servelab.workloads.text import build_byte_tokenizer, checkpoint_text

SIM = ("backend=sim", "model=llama3_8b")


def _write(tmp_path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("overrides, message", [
    (("workload.num_requests=0",),
     "workload.num_requests=0: the workload has no requests; set workload.num_requests>=1"),
    (("workload=trace", "workload.path=azure_conv", "workload.num_requests=0"),
     "workload.num_requests=0: the workload has no requests; set workload.num_requests>=1"),
    (("workload=hash_ids", "workload.num_requests=0"),
     "workload.num_requests=0: the workload has no requests; set workload.num_requests>=1"),
    (("workload=chat_sessions", "workload.num_sessions=0"),
     "workload.num_sessions=0: the workload has no requests; set workload.num_sessions>=1"),
    (("workload=jsonl", "workload.path={tmp}/empty.jsonl"), "{tmp}/empty.jsonl: no requests in this file"),
    (("workload=jsonl", "workload.path={tmp}/blank.jsonl"), "{tmp}/blank.jsonl: no requests in this file"),
    (("workload=trace", "workload.path={tmp}/header.csv"), "{tmp}/header.csv: no requests in this file"),
    (("workload=trace", "workload.path={tmp}/one.csv", "workload.start_row=1"),
     "{tmp}/one.csv: no requests in this file from workload.start_row=1 on"),
])
def test_an_empty_workload_is_refused_in_one_line_naming_the_key_or_file(tmp_path, overrides, message):
    _write(tmp_path, "empty.jsonl", "")
    _write(tmp_path, "blank.jsonl", "\n  \n")
    _write(tmp_path, "header.csv", "num_prefill_tokens,num_decode_tokens\n")
    _write(tmp_path, "one.csv", "num_prefill_tokens,num_decode_tokens\n10,5\n")
    cfg = compose(*(o.format(tmp=tmp_path) for o in overrides))
    with pytest.raises(WorkloadError) as err:
        build_requests(cfg.workload, 259, 2048, checkpoint_text(cfg))
    assert str(err.value) == message.format(tmp=tmp_path)


def test_an_empty_workload_on_the_command_line_exits_2_before_writing_results(tmp_path):
    proc = subprocess.run([sys.executable, str(REPO / "run.py"), *SIM, "logger=none", "workload.num_requests=0",
                           f"hydra.run.dir={tmp_path}"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == ("servelab: error: workload.num_requests=0: the workload has no "
                                                    "requests; set workload.num_requests>=1")
    assert "completed" not in proc.stdout and not (tmp_path / "summary.json").exists()


def test_an_empty_request_list_is_refused(tmp_path):
    with pytest.raises(WorkloadError, match=r"^run_job\(requests=\[\]\): no requests to run"):
        run_job(compose(*SIM), tmp_path, [])


@pytest.mark.parametrize("value, shown", [
    (None, "n/a"), (3, "3"), (0.0, "0.00"), (1.5, "1.50"), (12345.678, "12,345.68"), (0.5, "0.5"),
    (0.0011, "0.0011"), (0.0029123, "0.00291"), (0.99996, "1.00"), (-0.25, "-0.25"), (3.05e-05, "3.05e-05"),
])
def test_a_small_figure_keeps_its_significant_digits(value, shown):
    assert _fmt(value) == shown


def test_the_summary_table_shows_a_small_kv_use_as_non_zero():
    console = Console(record=True, width=100)
    print_summary({"status": "completed", "kv_utilization_mean": 0.0011, "kv_utilization_max": 0.0029}, "out", console)
    rows = [line for line in console.export_text().splitlines() if "kv_utilization" in line]
    assert "0.0011" in rows[0] and "0.0029" in rows[1], rows


def _record(rid, prompt_text, output_ids, output_text, finish="stop"):
    return {"id": rid, "prompt_len": 40, "output_len": len(output_ids), "output_token_ids": output_ids,
            "finish_reason": finish, "prompt_text": prompt_text, "output_text": output_text}


def test_token_id_samples_show_ids_not_decoded_bytes():
    tok = build_byte_tokenizer()
    rng = np.random.default_rng(0)
    prompt, output = rng.integers(0, 259, 40).tolist(), rng.integers(0, 259, 30).tolist()
    records = [_record("trace-0", tok.decode(prompt, skip_special_tokens=True), output,
                       tok.decode(output, skip_special_tokens=True))]
    console = Console(record=True, width=100, file=io.StringIO())
    print_samples(records, console)
    out = console.export_text()
    assert "prompt:     40 token ids (not text: a token-id workload)" in out
    assert f"completion: token ids {output[:16]} ... (+14) (not text)" in out
    assert all(c in "\n" or c.isprintable() for c in out), repr(out)


def test_prompt_and_completion_are_told_apart_in_words_without_colour():
    records = [_record("corpus-0", "def add(a, b):\n", [9] * 3, "    return a + b\n"),
               _record("corpus-1", "x = ", [9], "1\ufffd", finish="length"),  # an output cut inside a character
               _record("corpus-2", "y = ", [7, 0], "\x07\x00", finish="length")]  # a random-weight model's bytes
    stream = io.StringIO()
    print_samples(records, Console(file=stream, width=100, color_system=None))  # a pipe: no colour
    out = stream.getvalue()
    assert "\x1b" not in out
    assert "prompt:     def add(a, b):\n" in out and "completion:     return a + b" in out
    assert "prompt:     x = \ncompletion: 1" in out
    assert "prompt:     y = \ncompletion: token ids [7, 0] (not text)" in out


class _Stream(io.StringIO):
    def __init__(self, tty: bool) -> None:
        super().__init__()
        self.tty = tty

    def isatty(self) -> bool:
        return self.tty


def test_progress_on_a_terminal_is_tqdms_bar_elsewhere_a_line_per_tenth():
    from tqdm.std import tqdm

    bar = _progress_bar(25, True, _Stream(tty=True))
    assert isinstance(bar, tqdm)
    bar.close()
    stream = _Stream(tty=False)
    progress = _progress_bar(25, True, stream)
    assert isinstance(progress, LineProgress)
    for _ in range(25):
        progress.update(1)
    progress.close()
    lines = stream.getvalue().split("\n")
    assert "\r" not in stream.getvalue() and lines[-1] == ""  # every line ends in a newline
    assert [line.split(" (")[0] for line in lines[:-1]] == [f"requests: {n}/25" for n in (3, 5, 8, 10, 13, 15, 18,
                                                                                          20, 23, 25)]


def test_progress_lines_also_come_every_so_many_seconds():
    now = [0.0]
    stream = io.StringIO()
    progress = LineProgress(1000, stream, every_s=60, clock=lambda: now[0])
    for _ in range(5):
        now[0] += 30
        progress.update(1)
    progress.close()
    assert [line.split(" (")[0] for line in stream.getvalue().splitlines()] == [
        "requests: 2/1000", "requests: 4/1000", "requests: 5/1000"]


def test_a_run_whose_stderr_is_not_a_terminal_prints_plain_progress_lines(tmp_path, capsys):
    run_job(compose(*SIM, "workload.num_requests=4", progress=True), tmp_path)
    err = capsys.readouterr().err
    assert "\r" not in err and "requests: 4/4 (100%)" in err
    assert json.loads((tmp_path / "summary.json").read_text())["num_finished"] == 4
