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
