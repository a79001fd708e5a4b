"""Errors in one line whoever raises them, and the command line around runs (issue 36, items 2-3).

One table of commands, each run in a subprocess (in parallel threads: the run is the start-up of
Python, torch and Hydra), with the exit code and the first line on stderr it must give; then the
cases that look at more than that line (a failed multirun, a busy port), and in-process checks of
the messages and helpers behind them.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from conftest import REPO
from servelab.cli.main import SUBCOMMANDS
from servelab.core.registry import default_registry

BIN = Path(sys.executable).parent
SIM = ["backend=sim", "model=llama3_8b", "logger=none", "workload.num_requests=4", "progress=false"]
SCHEDULERS = ", ".join(sorted(default_registry().names("scheduler")))  # the installed ones, as the error lists
COMMANDS = f"{', '.join(SUBCOMMANDS)} (a run takes key=value overrides: servelab [key=value ...])"
HAS_CUDA = __import__("torch").cuda.is_available()

# (id, argv after the program, env, exit code, first stderr line: exact, or a prefix when it ends in "...")
CASES = [
    ("unknown-key", ["run.py", "blok_size=8"], {}, 2,
     "servelab: error: unknown key 'blok_size'; did you mean 'block_size'?"),
    ("plus-key-outside-the-schema", ["run.py", *SIM, "+swap_space_gib=0"], {}, 2,
     "servelab: error: unknown key 'swap_space_gib'; did you mean 'backend.swap_space_gb'?"),
    ("plus-key-of-another-option", ["run.py", *SIM, "+workload.path=f.jsonl"], {}, 2,
     "servelab: error: unknown key 'workload.path': workload=synthetic has no path; workload=jsonl, ..."),
    ("unknown-group-option", ["run.py", "scheduler=fcfx"], {}, 2,
     f"servelab: error: unknown scheduler option 'fcfx'; did you mean 'fcfs'? options: {SCHEDULERS}"),
    ("unknown-experiment", ["run.py", "experiment=nope"], {}, 2,
     "servelab: error: unknown experiment option 'nope'; options: block_size_sweep, ..."),
    ("unknown-flag", ["run.py", "--bogus"], {}, 2, "servelab: error: unknown option --bogus ..."),
    ("mistyped-subcommand", ["servelab", "compar", "x"], {}, 2,
     f"servelab: error: unknown command 'compar'; did you mean 'compare'? commands: {COMMANDS}"),
    ("run-is-not-a-subcommand", ["servelab", "run", "block_size=8"], {}, 2,
     f"servelab: error: unknown command 'run'; commands: {COMMANDS}"),
    ("device-misspelt", ["run.py", *SIM, "backend=torch", "model=tiny", "backend.device=gpu"], {}, 2,
     "servelab: error: backend.device=gpu is not a device: use auto, cpu, cuda or cuda:N"),
    ("profile-ops-device-misspelt", ["servelab", "profile-ops", "backend.device=gpu"], {}, 2,
     "servelab profile-ops: error: backend.device=gpu is not a device: use auto, cpu, cuda or cuda:N"),
    ("full-error-keeps-the-trace", ["run.py", "blok_size=8"], {"HYDRA_FULL_ERROR": "1"}, 1, "Traceback ..."),
    ("eval-ppl-help", ["servelab", "eval-ppl", "--help"], {}, 0, ""),
    ("eval-ppl-names-the-configured-model", ["servelab", "eval-ppl", "model=llama3_70b"], {}, 2,
     "servelab eval-ppl: error: eval-ppl: model=llama3_70b is a shape without weights (for backend=sim); ..."),
    # KV tiers (issue 48): a preset picks write_back, so a bad tier setting no longer passes unused
    ("kv-tiers-disk-dir-unwritable", ["run.py", *SIM, "kv_tiers=host_disk", "kv_tiers.disk_dir=/proc/nope"], {}, 2,
     "servelab: error: kv_tiers.disk_dir=/proc/nope: not writable (no file can be made in /proc: ..."),
    ("kv-tiers-disk-dir-without-a-disk", ["run.py", *SIM, "kv_tiers=host", "kv_tiers.disk_dir=/tmp"], {}, 2,
     "servelab: error: kv_tiers.disk_dir=/tmp: kv_tiers=host has no disk tier to keep there; ..."),
    ("kv-tiers-without-prefix-caching", ["run.py", *SIM, "kv_tiers=host_disk", "allocator.prefix_caching=false"], {},
     2, "servelab: error: kv_tiers=host_disk holds prefix-cache blocks, and allocator=paged caches none here: ..."),
    ("kv-tiers-over-ranks-on-a-real-engine", ["run.py", *SIM, "backend=torch", "model=tiny", "kv_tiers=host",
                                              "tensor_parallel_size=2"], {}, 2,
     "servelab: error: kv_tiers=host with tensor_parallel_size=2 on backend=torch: a real engine's tiers need one ..."),
]
if not HAS_CUDA:
    CASES.append(("device-cuda-without-cuda", ["run.py", *SIM, "backend=torch", "model=tiny", "backend.device=cuda"],
                  {}, 2, "servelab: error: backend.device=cuda but CUDA is not available on this machine ..."))


def run(argv: list[str], env: dict | None = None, cwd: str | None = None, timeout: int = 300):
    """``run.py ...`` or ``servelab ...`` in a scratch folder (results of a run land there)."""
    program = [sys.executable, str(REPO / "run.py")] if argv[0] == "run.py" else [str(BIN / argv[0])]
    cwd = cwd or tempfile.mkdtemp(prefix="servelab-errors-")
    return subprocess.run([*program, *argv[1:]], cwd=cwd, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})})


@pytest.fixture(scope="module")
def results():
    with ThreadPoolExecutor(max_workers=4) as pool:
        procs = pool.map(lambda case: run(case[1], case[2]), CASES)
        return dict(zip((c[0] for c in CASES), procs))


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_exit_code_and_first_stderr_line(case, results):
    name, _, _, code, first = case
    proc = results[name]
    lines = proc.stderr.strip().splitlines()
    got = lines[0] if lines else ""
    assert proc.returncode == code, proc.stderr[-2000:]
    if first.endswith("..."):
        assert got.startswith(first[:-3].rstrip()), got
    else:
        assert got == first, proc.stderr[-2000:]
    if code == 2:  # bad input: the one line, nothing else on stderr
        assert len(lines) == 1, proc.stderr[-2000:]


def test_a_failed_run_ends_with_its_results_folder(results):
    proc = results["plus-key-outside-the-schema"]  # failed after Hydra made its folder
    last = proc.stdout.strip().splitlines()[-1]
    assert re.fullmatch(r"results: \S+", last), proc.stdout[-2000:]
    folder = Path(last.split(" ", 1)[1])
    assert (folder / "error.txt").read_text() == "unknown key 'swap_space_gib'; did you mean 'backend.swap_space_gb'?\n"


def test_eval_ppl_help_is_its_usage_in_plain_text(results):
    out = results["eval-ppl-help"].stdout
    assert out.startswith("usage: servelab eval-ppl") and "held-out perplexity" in out and "``" not in out


def test_a_multirun_with_a_failing_job_and_long_overrides(tmp_path):
    """A job that fails at start-up is reported once, in one line, leaves error.txt, and the others run;
    the sweep exits 1 after them. The overrides are longer than a file name may be: the job folders
    are cut with a hash."""
    long = "x" * 300
    proc = run(["run.py", "-m", *SIM, f"logger.project={long}", "block_size=24,16", f"hydra.sweep.dir={tmp_path}"])
    assert proc.returncode == 1, proc.stderr[-3000:]
    errors = [line for line in proc.stderr.splitlines() if line.strip()]
    assert errors[0] == "servelab: error: block_size=24 must be a power of two between 1 and 256, or auto", errors
    assert errors[1].startswith("servelab: error: 1 of 2 jobs failed: 0_") and len(errors) == 2, errors
    assert "Traceback" not in proc.stderr and "Error executing job" not in proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == f"results: {tmp_path}"
    failed, = tmp_path.glob("0_*")
    done, = tmp_path.glob("1_*")
    assert len(failed.name.encode()) < 120 and re.search(r"-[0-9a-f]{8}$", failed.name), failed.name
    assert (failed / "error.txt").read_text().startswith("block_size=24 must be a power of two")
    assert json.loads((done / "summary.json").read_text())["status"] == "completed"


def test_serve_on_a_busy_port_fails_at_once_without_a_results_folder(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        proc = run(["servelab", "serve", "--port", str(port), "model=tiny", "logger=none",
                    f"hydra.run.dir={tmp_path}/out"])
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines() == [
        f"servelab serve: error: serve.port={port}: cannot listen on 127.0.0.1:{port} (Address already in use); "
        "choose another with --port N (0 = any free port) or stop the server that holds it"]
    assert not (tmp_path / "out").exists()


def test_help_pages_are_plain_text_and_block_size_is_int_or_auto(capsys):
    from servelab.cli import profile, profile_ops
    from servelab.cli.usage import usage_text
    from servelab.serve.command import parse_args

    assert "  block_size: int | auto = 16" in usage_text().splitlines()
    for show in (lambda: profile.profile_main(["--help"]), lambda: profile_ops.main(["--help"])):
        assert show() == 0
        out = capsys.readouterr().out
        assert out.startswith("usage: servelab profile") and "``" not in out and ":mod:" not in out
    with pytest.raises(SystemExit):
        parse_args(["--help"])
    out = capsys.readouterr().out
    assert "OpenAI-compatible" in out and "``" not in out


@pytest.mark.parametrize("text, expected", [
    ("a" * 10, "a" * 10),
    ("model.path=/data/ckpt", "model.path=_data_ckpt"),
])
def test_sweep_subdir_keeps_short_names_and_replaces_slashes(text, expected):
    from servelab.config import safe_dirname

    assert safe_dirname(text) == expected
    long = safe_dirname("block_size=8," + "y" * 400)
    assert len(long.encode()) == 109 and long != safe_dirname("block_size=8," + "y" * 399)


@pytest.mark.parametrize("override, message", [
    ("backend.devcie=cpu", "unknown key 'backend.devcie'; did you mean 'backend.device'?"),
    ("workload.nmu_requests=3", "unknown key 'workload.nmu_requests'; did you mean 'workload.num_requests'?"),
    ("scheduler.margin=0.5",
     "unknown key 'scheduler.margin': scheduler=fcfs has no margin; scheduler=slo_aware has it"),
    ("workload.path=f.jsonl", "unknown key 'workload.path': workload=synthetic has no path; workload=jsonl, "
                              "workload=trace, workload=hash_ids, workload=prompts have it"),
    ("max_num_seqs=many", "max_num_seqs=many: Value 'many' of type 'str' could not be converted to Integer"),
    ("model=llama3_7b", "unknown model option 'llama3_7b'; did you mean 'llama3_70b'? options: hf, llama2_13b, "
                        "llama2_70b, llama2_7b, llama3_70b, llama3_8b, mistral_7b, qwen2_72b, tiny, tiny_code, "
                        "tiny_code_draft"),
])
def test_compose_errors_are_one_line_against_the_schema(override, message):
    """The line a compose error becomes, from Hydra's compose API (the subcommands' and the Python API's
    path: a ConfigError) as from run.py."""
    from conftest import compose
    from servelab.core.errors import ConfigError

    with pytest.raises(ConfigError) as err:
        compose(override)
    assert str(err.value) == message


def test_a_plus_key_outside_the_schema_is_refused():
    from conftest import compose
    from servelab.core.errors import ConfigError
    from servelab.config import check_known_keys

    with pytest.raises(ConfigError, match=r"^unknown key 'slo.ttft'; did you mean 'slo.ttft_ms'\?$"):
        check_known_keys(compose("+slo.ttft=3"))
    check_known_keys(compose("workload=synthetic", "workload.clients=[{id: a, share: 1}]"))  # lists of typed nodes


@pytest.mark.parametrize("made, line", [
    (None, "interrupted before the run started; nothing written"),
    ("folder", "interrupted before the run started; nothing written"),
    ("set-up", "interrupted before the run started: no results; {dir} holds its set-up only"),
    ("summary", "interrupted; partial results written to {dir}"),
])
def test_ctrl_c_says_nothing_written_only_when_nothing_is(tmp_path, capsys, monkeypatch, made, line):
    import importlib

    cli_main = importlib.import_module("servelab.cli.main")  # the module (the package's `main` is the function)
    run_dir = tmp_path / "run"
    if made:
        run_dir.mkdir()
    if made == "set-up":
        (run_dir / "servelab.log").write_text("")
    if made == "summary":
        (run_dir / "summary.json").write_text("{}")
    monkeypatch.setattr(cli_main, "_current_output_dir", str(run_dir))
    with pytest.raises(SystemExit) as stop:
        cli_main._interrupted()
    assert stop.value.code == 130
    assert capsys.readouterr().err.strip() == line.format(dir=run_dir)


# ---- issue 48: every case one line, the right exit code, no traceback; in this process ------------
# (id, argv after `servelab`, exit code, the stderr line: exact, or a prefix when it ends in "...").
# {tmp} is a scratch folder holding the files below; {file} a plain file (a "folder" nothing can go into).
BROKEN = '{"hidden_size": 8,\n'
FILES = {
    "file": "not a folder\n",
    "broken/config.json": BROKEN,
    "minus5.csv": "num_prefill_tokens,num_decode_tokens\n10,5\n-5,3\n",
    "zero_out.csv": "num_prefill_tokens,num_decode_tokens\n10,5\n7,4\n12,0\n9,9\n",
    "minus_max.jsonl": '{"prompt_len": 4, "max_tokens": 3}\n\n{"prompt_len": 4, "max_tokens": -2}\n',
    "zero_len.jsonl": '{"prompt_len": 0, "max_tokens": 3}\n',
    "hash.jsonl": '{"timestamp": 0, "input_length": 16, "output_length": 0, "hash_ids": [1]}\n',
    "run/summary.json": '{"status": "completed", "num_requests": 0}\n',  # a run, for servelab report
    "cut/summary.json": '{"status": \n',  # a run's summary cut short
}
LEN = "is not a length (each request needs >= 1 prompt token and >= 1 output token); fix or drop the row"
WRITE = "choose a folder you can write to"
ONE_LINE_CASES = [
    # tracebacks and wrong codes
    ("grade-out-unwritable", ["grade", "scheduler=fcfs", "--out", "/proc/nope/x.md"], 2,
     "servelab grade: error: --out /proc/nope/x.md: cannot write to /proc/nope (..."),
    ("grade-out-under-a-file", ["grade", "scheduler=fcfs", "--out", "{file}/x.md"], 2,
     f"servelab grade: error: --out {{file}}/x.md: cannot write to {{file}} ({{file}} is a file, not a folder); {WRITE}"),
    ("compare-out-unwritable", ["compare", "{tmp}", "--out", "{file}/cmp.md"], 2,
     f"servelab compare: error: --out {{file}}/cmp.md: cannot write to {{file}} ({{file}} is a file, not a folder); "
     f"{WRITE}"),
    ("bench-output-dir-unwritable", ["bench", *SIM, "bench.rates=[1]", "bench.output_dir={file}/b"], 2,
     f"servelab bench: error: bench.output_dir={{file}}/b: cannot write to {{file}}/b ({{file}} is a file, not a "
     f"folder); {WRITE}"),
    ("new-plugin-dir-unwritable", ["new-plugin", "scheduler", "my_sched", "--dir", "{file}/p"], 2,
     f"servelab new-plugin: error: --dir {{file}}/p: cannot write to {{file}}/p ({{file}} is a file, not a folder); "
     f"{WRITE}"),
    ("serve-output-dir-unwritable", ["serve", "model=tiny", "logger=none", "serve.output_dir={file}/s"], 2,
     f"servelab serve: error: serve.output_dir={{file}}/s: cannot write to {{file}}/s ({{file}} is a file, not a "
     f"folder); {WRITE}"),
    ("eval-ppl-output-dir-unwritable", ["eval-ppl", "model=tiny_code", "eval_ppl.output_dir={file}/e"], 2,
     f"servelab eval-ppl: error: eval_ppl.output_dir={{file}}/e: cannot write to {{file}}/e ({{file}} is a file, not "
     f"a folder); {WRITE}"),
    ("profile-out-unwritable", ["profile", "--out={file}/p.json", "model=tiny"], 2,
     f"servelab profile: error: --out={{file}}/p.json: cannot write to {{file}} ({{file}} is a file, not a folder); "
     f"{WRITE}"),
    ("run-dir-unwritable", [*SIM, "hydra.run.dir={file}/run"], 2,
     "servelab: error: hydra.run.dir: cannot write to {file}/run (Not a directory); choose a folder you can write to"),
    ("serve-host-not-an-address", ["serve", "--host", "999.1.1.1", "model=tiny", "logger=none"], 2,
     "servelab serve: error: serve.host=999.1.1.1: not an address of this machine (..."),
    ("profile-ops-unknown-flag", ["profile-ops", "--bogus"], 2,
     "servelab profile-ops: error: unknown option --bogus: servelab profile-ops takes Hydra overrides (key=value); "
     "servelab profile-ops --help"),
    ("profile-unknown-flag", ["profile", "--bogus"], 2,
     "servelab profile: error: unknown option --bogus: servelab profile takes --out=FILE, --rounds=N and Hydra "
     "overrides (key=value); servelab profile --help"),
    ("logger-mode-misspelt", ["backend=sim", "model=llama3_8b", "logger.mode=onilne"], 2,
     "servelab: error: logger.mode=onilne: Invalid value 'onilne', expected one of [offline, online, disabled, shared]"),
    ("broken-config-json", ["model=hf", "model.path={tmp}/broken", "workload=synthetic", "workload.num_requests=2",
                            "logger=none", "progress=false"], 2,
     "servelab: error: model.path='{tmp}/broken': {tmp}/broken/config.json is not valid JSON (Expecting ..."),
    ("broken-config-json-sim", [*SIM[:1], "model=hf", "model.path={tmp}/broken", *SIM[2:]], 2,
     "servelab: error: model.path='{tmp}/broken': cannot read a config.json there (Expecting ..."),
    ("report-not-a-run", ["report", "{tmp}/broken"], 2,
     "servelab report: error: {tmp}/broken: not a run folder (no summary.json, nor a folder holding runs); give the "
     "folder a run wrote its results to"),
    ("report-no-such-folder", ["report", "{tmp}/nope"], 2, "servelab report: error: {tmp}/nope: no such folder"),
    ("report-summary-cut-short", ["report", "{tmp}/cut"], 2,
     "servelab report: error: {tmp}/cut/summary.json: cannot read it (Expecting value: ..."),
    ("report-out-under-a-file", ["report", "{tmp}/run", "--out", "{file}/r"], 2,
     f"servelab report: error: --out {{file}}/r: cannot write to {{file}}/r ({{file}} is a file, not a folder); {WRITE}"),
    ("report-out-unwritable", ["report", "{tmp}/run", "--out", "/proc/nope/r"], 2,
     "servelab report: error: --out /proc/nope/r: cannot write to /proc/nope/r (..."),
    # silently accepted
    ("trace-prompt-of-minus-5", [*SIM, "workload=trace", "workload.path={tmp}/minus5.csv"], 2,
     f"servelab: error: {{tmp}}/minus5.csv:3: num_prefill_tokens=-5 {LEN}"),
    # seed 0 samples rows 1, 2, 3 of 0..3: the file's line of the sampled row, not its place in the sample
    ("trace-output-of-0", [*SIM, "workload=trace", "workload.path={tmp}/zero_out.csv", "workload.sample=random",
                           "workload.num_requests=3", "workload.seed=0"], 2,
     f"servelab: error: {{tmp}}/zero_out.csv:4: num_decode_tokens=0 {LEN}"),
    ("trace-resampled-output-of-0", [*SIM, "workload=trace", "workload.path={tmp}/zero_out.csv",
                                     "workload.sample=resample", "workload.num_requests=8"], 2,
     f"servelab: error: {{tmp}}/zero_out.csv:4: num_decode_tokens=0 {LEN}"),
    ("hash-ids-output-of-0", [*SIM, "workload=hash_ids", "workload.path={tmp}/hash.jsonl"], 2,
     f"servelab: error: {{tmp}}/hash.jsonl:1: output_length=0 {LEN}"),
    ("jsonl-negative-max-tokens", [*SIM[:3], "workload=jsonl", "workload.path={tmp}/minus_max.jsonl"], 2,
     "servelab: error: {tmp}/minus_max.jsonl:3: max_tokens=-2 must be >= 1"),
    ("jsonl-prompt-len-0", [*SIM[:3], "workload=jsonl", "workload.path={tmp}/zero_len.jsonl"], 2,
     "servelab: error: {tmp}/zero_len.jsonl:1: prompt_len=0 must be >= 1"),
    ("evictor-without-prefix-caching", [*SIM, "evictor=arc"], 2,
     "servelab: error: evictor=arc chooses which cached prefix block to give up, and allocator=paged caches none "
     "here: add allocator.prefix_caching=true (or drop evictor=arc)"),
    ("num-threads-0", [*SIM, "backend.num_threads=0"], 2,
     "servelab: error: backend.num_threads=0 must be >= 1 (torch's threads per rank; null = torch's default)"),
    ("time-scale-0", [*SIM, "workload.time_scale=0"], 2,
     "servelab: error: workload.time_scale=0.0 must be > 0: it multiplies every arrival time (0.5 = twice as fast); "
     "for every request at once use workload.arrival=all_at_once"),
    ("time-scale-negative", [*SIM, "workload.time_scale=-2"], 2, "servelab: error: workload.time_scale=-2.0 must be > 0: ..."),
    ("check-plugin-cases-0", ["check-plugin", "scheduler=fcfs", "--cases", "0"], 2,
     "servelab check-plugin: error: --cases 0: give at least 1 random scenario (default 50)"),
    ("check-plugin-cases-negative", ["check-plugin", "scheduler=fcfs", "--cases", "-1"], 2,
     "servelab check-plugin: error: --cases -1: give at least 1 random scenario (default 50)"),
]


@pytest.fixture(scope="module")
def scratch(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("one-line")
    for name, text in FILES.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


def servelab_here(argv: list[str], cwd: Path, monkeypatch, capsys) -> tuple[int, str, str]:
    """``servelab <argv>`` in this process (the console script's ``main``), in folder ``cwd``: its exit
    code, stdout and stderr. What main() sets in the environment, and the log handlers a Hydra run adds
    (on this test's captured streams), are undone afterwards."""
    import importlib
    import logging

    cli_main = importlib.import_module("servelab.cli.main")
    monkeypatch.chdir(cwd)
    monkeypatch.setattr(sys, "argv", ["servelab", *argv])
    for var in ("HYDRA_FULL_ERROR", "SERVELAB_ONE_LINE_ERRORS"):
        monkeypatch.setenv(var, "")
        monkeypatch.delenv(var)
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    capsys.readouterr()
    try:
        with pytest.raises(SystemExit) as stop:
            cli_main.main()
    finally:
        for handler in root.handlers[:]:
            if handler not in handlers:
                root.removeHandler(handler)
                handler.close()
        root.setLevel(level)
    out, err = capsys.readouterr()
    return stop.value.code or 0, out, err


def check_one_line(code: int, out: str, err: str, want_code: int, first: str) -> None:
    """The exit code, stderr exactly one line (``first``, or its prefix before "..."), no traceback anywhere."""
    lines = err.strip().splitlines()
    assert code == want_code, err[-2000:]
    assert "Traceback" not in err + out, (err + out)[-3000:]
    assert len(lines) == 1, err[-2000:]
    if first.endswith("..."):
        assert lines[0].startswith(first[:-3]), lines[0]
    else:
        assert lines[0] == first, lines[0]


@pytest.mark.parametrize("case", ONE_LINE_CASES, ids=[c[0] for c in ONE_LINE_CASES])
def test_each_mistake_is_one_line_and_exit_2(case, scratch, tmp_path, monkeypatch, capsys):
    name, argv, code, first = case
    fill = {"tmp": str(scratch), "file": str(scratch / "file")}
    argv = [a.format(**fill) for a in argv]
    got = servelab_here(argv, tmp_path, monkeypatch, capsys)
    check_one_line(*got, code, first.format(**fill))
    if name.startswith(("grade", "compare", "bench", "new-plugin", "check-plugin")):  # refused before the work
        assert not (tmp_path / "outputs").exists(), list((tmp_path / "outputs").rglob("*"))
    if name.startswith("report"):
        assert not (scratch / "run" / "report_figures").exists()


def test_route_on_a_busy_port_blames_route_port(tmp_path, monkeypatch, capsys):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        got = servelab_here(["route", "--port", str(port), "model=tiny", "logger=none"], tmp_path, monkeypatch, capsys)
    check_one_line(*got, 2, f"servelab route: error: route.port={port}: cannot listen on 127.0.0.1:{port} (Address "
                   "already in use); choose another with --port N (0 = any free port) or stop the server that holds it")


@pytest.mark.parametrize("overrides", [["scheduler=fcfx"], ["blok_size=8"], ["max_num_seqs=many"]])
def test_the_python_api_raises_the_command_lines_line(overrides, tmp_path, monkeypatch, capsys):
    """``servelab.LLM([...])``: one ConfigError whose message is what the command line prints (no
    Hydra exception, no chained trace)."""
    import servelab
    from servelab.core.errors import ConfigError

    with pytest.raises(ConfigError) as err:
        servelab.LLM(overrides, logger="none")
    assert err.value.__cause__ is None and err.value.__suppress_context__
    code, _, line = servelab_here(overrides, tmp_path, monkeypatch, capsys)
    assert (code, line.strip()) == (2, f"servelab: error: {err.value}")


def test_servelab_help_lists_every_subcommand_from_the_table():
    from servelab.cli.subcommands import SUBCOMMANDS
    from servelab.cli.usage import usage_text

    lines = usage_text().splitlines()
    for name, entry in SUBCOMMANDS.items():
        assert any(line.split() and line.split()[0] == name and line.endswith(entry.summary) for line in lines), name
    assert "route" in SUBCOMMANDS


def test_an_interrupted_bench_keeps_the_curve_of_its_finished_points(tmp_path, monkeypatch, capsys):
    """Ctrl-C during the third point: curve.csv, knee.json and curve.png of the two that finished, one
    line saying so, ``results: <folder>`` last, exit 130."""
    import csv

    import servelab.run.session as session

    real_run_job, calls = session.run_job, []

    def run_job(cfg, folder, *args, **kwargs):
        calls.append(folder)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real_run_job(cfg, folder, *args, **kwargs)

    monkeypatch.setattr(session, "run_job", run_job)
    out = tmp_path / "bench"
    code, stdout, err = servelab_here(["bench", *SIM, "workload.num_requests=6", "bench.rates=[1,2,4,8]", "slo.ttft_ms=1000",
                                       f"bench.output_dir={out}"], tmp_path, monkeypatch, capsys)
    assert code == 130 and len(calls) == 3
    assert err.strip().splitlines() == [
        f"servelab bench: interrupted at point 3 of 4 (2_rate=4: partial, not in the curve); curve.csv, knee.json and "
        f"curve.png of the 2 finished points written to {out} (knee: rate=2 (the SLO, p90 ttft_ms <= 1000, holds at "
        "every point; the knee is past the sweep))"]
    assert stdout.strip().splitlines()[-1] == f"results: {out}"
    rows = list(csv.DictReader((out / "curve.csv").open()))
    assert [r["load"] for r in rows] == ["1.0", "2.0"] and all(r["status"] == "completed" for r in rows)
    assert json.loads((out / "knee.json").read_text())["knee"] == 2.0 and (out / "curve.png").stat().st_size > 0


def test_a_bench_interrupted_in_its_first_point_says_no_curve(tmp_path, monkeypatch, capsys):
    import servelab.run.session as session

    def run_job(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(session, "run_job", run_job)
    out = tmp_path / "bench"
    code, stdout, err = servelab_here(["bench", *SIM, "bench.rates=[1,2]", f"bench.output_dir={out}"], tmp_path, monkeypatch,
                                      capsys)
    assert code == 130 and not (out / "curve.csv").exists()
    assert err.strip().splitlines() == [f"servelab bench: interrupted at point 1 of 2 (0_rate=1: partial, not in the "
                                        f"curve); no point finished: no curve; {out} holds bench.yaml"]
    assert stdout.strip().splitlines()[-1] == f"results: {out}"


def test_a_replica_process_ignores_ctrl_c_and_the_parent_gets_it_back():
    """The fast twin of the real-engine cluster's Ctrl-C: a process spawned as the replicas are (spawn,
    inside :func:`children_ignore_ctrl_c`) lives through a SIGINT to itself, exiting 0 without a
    traceback, and the parent's own Ctrl-C handling is back afterwards."""
    import multiprocessing
    import signal

    from servelab.cluster.procs.engine import children_ignore_ctrl_c

    before = signal.getsignal(signal.SIGINT)
    with children_ignore_ctrl_c():
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        child = multiprocessing.get_context("spawn").Process(target=signal.raise_signal, args=(signal.SIGINT,))
        child.start()
    assert signal.getsignal(signal.SIGINT) is before
    child.join(120)
    assert child.exitcode == 0


@pytest.mark.slow
def test_ctrl_c_on_a_real_engine_cluster_is_one_line_from_the_parent(tmp_path):
    """Ctrl-C as a terminal sends it (SIGINT to the whole process group) once the two engine processes
    of a ``model=tiny_code`` cluster run serve requests (the first progress line: a tenth have ended):
    the parent's one line, exit 130, partial results, and not a word (no traceback) from either replica.
    About a minute on 2 cores: the fast twin is the test above."""
    import signal

    proc = subprocess.Popen([str(BIN / "servelab"), "cluster.replicas=2", "router=round_robin", "model=tiny_code",
                             "logger=none", "progress=true", "workload.num_requests=50", f"hydra.run.dir={tmp_path}"],
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    try:
        before = []
        for line in proc.stderr:  # not a terminal: a progress line per tenth of the requests ended
            before.append(line)
            if line.startswith("requests: "):
                os.killpg(proc.pid, signal.SIGINT)
                break
        out, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    said = [line for line in err.strip().splitlines() if not line.startswith("requests: ")]
    assert proc.returncode == 130, err[-3000:]
    assert "Traceback" not in "".join(before) + err + out, err[-3000:]
    assert said == [f"interrupted; partial results written to {tmp_path}"], err[-3000:]
    assert out.strip().splitlines()[-1] == f"results: {tmp_path}"
    assert json.loads((tmp_path / "summary.json").read_text())["status"] == "interrupted"
