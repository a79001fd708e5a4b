"""The Hydra entry point behind ``run.py`` (and the ``servelab`` console script).

Errors reach the user as one line, whoever raises them (docs/configuration.md): servelab's own
(``servelab: error: <msg>``), Hydra's and OmegaConf's at compose time (translated against the
schema by :func:`servelab.config.messages.config_error_message`), an unknown subcommand, a key outside
the schema. ``HYDRA_FULL_ERROR=1`` still prints the full trace. Exit codes: 0 done, 1 a failed run
(or a sweep with a failed job), 2 bad input, 130 interrupted.
"""

from __future__ import annotations

import argparse
import difflib
import importlib
import os
import sys
import traceback
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach for a hub at run time

import hydra
from hydra._internal.utils import get_args_parser
from hydra.core.hydra_config import HydraConfig
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import HydraException
from hydra.types import RunMode
from omegaconf import DictConfig

from servelab.cli.help import help_text
from servelab.cli.subcommands import SUBCOMMANDS
from servelab.core.errors import ServelabError
from servelab.core.registry import PluginError, check_selection
from servelab.config import (ERROR_FILE, SweepReport, check_experiment_option, check_known_keys,
                                 config_error_message, register_configs)


_current_output_dir: str | None = None  # the running job's folder, for the Ctrl-C line
# set by main() for the run (and inherited by a launcher's worker processes): errors are one line.
# main() sets HYDRA_FULL_ERROR=1 itself so Hydra raises instead of printing; this says it was not the user.
_ONE_LINE = "SERVELAB_ONE_LINE_ERRORS"


@hydra.main(config_path="pkg://servelab.conf", config_name="config", version_base="1.3")
def _hydra_main(cfg: DictConfig) -> float | None:
    from servelab.assemble.preflight import check_device  # noqa: PLC0415 - torch on demand
    from servelab.results.report import all_rejected_error, print_samples, print_summary  # noqa: PLC0415 - rich
    from servelab.run.session import run_job  # noqa: PLC0415 - torch

    global _current_output_dir
    hydra_cfg = HydraConfig.get()
    output_dir = _current_output_dir = hydra_cfg.runtime.output_dir
    multirun = hydra_cfg.mode == RunMode.MULTIRUN
    Path(output_dir, ERROR_FILE).unlink(missing_ok=True)  # a rerun into the same folder: this run's outcome only
    try:
        check_known_keys(cfg)  # a +key=value outside the schema: nothing would read it
        check_device(cfg)
        result = run_job(cfg, output_dir, banner=True)
        print_samples(result.iter_requests())
        print_summary(result.summary, output_dir)
        error = all_rejected_error(result.summary)
        if error:
            raise ServelabError(error)
    except ServelabError as exc:
        _job_failed(output_dir, str(exc), 2, multirun)
        return None
    except Exception as exc:
        if os.environ.get(_ONE_LINE) != "1":
            raise  # HYDRA_FULL_ERROR=1: Hydra prints the whole trace
        trace = Path(output_dir, "traceback.txt")
        trace.write_text(traceback.format_exc())
        _job_failed(output_dir, f"{type(exc).__name__}: {exc} (the traceback is in {trace})", 1, multirun)
        return None
    return result.summary.get("output_throughput_tok_s")


def _job_failed(output_dir: str, message: str, code: int, multirun: bool) -> None:
    """A failed run: its one-line error on stderr and in ``error.txt``, then ``results: DIR`` as the
    last line; exit ``code``. A multirun's job returns instead, so the other jobs run (in this
    process or a launcher's workers) and the sweep reports the failed ones once at the end."""
    message = " ".join(message.split("\n"))
    print(f"servelab: error: {message}", file=sys.stderr, flush=True)
    Path(output_dir, ERROR_FILE).write_text(message + "\n")
    print(f"results: {output_dir}", flush=True)
    if not multirun:
        sys.exit(code)


def _interrupted() -> None:
    """Ctrl-C: one line saying what was kept (the session wrote the partial results), exit 130."""
    done = _current_output_dir and os.path.isfile(os.path.join(_current_output_dir, "summary.json"))
    if done:
        print(f"interrupted; partial results written to {_current_output_dir}", file=sys.stderr, flush=True)
        print(f"results: {_current_output_dir}", flush=True)  # the last line of every run with a folder
    elif _current_output_dir and Path(_current_output_dir).is_dir() and any(Path(_current_output_dir).iterdir()):
        # the set-up got as far as the run's folder (Hydra's config, the log, W&B's files): say so
        print(f"interrupted before the run started: no results; {_current_output_dir} holds its set-up only",
              file=sys.stderr, flush=True)
        print(f"results: {_current_output_dir}", flush=True)
    else:
        print("interrupted before the run started; nothing written", file=sys.stderr)
    sys.exit(130)




def _fail(message: str, code: int = 2) -> None:
    print(f"servelab: error: {message}", file=sys.stderr, flush=True)
    sys.exit(code)


def unknown_command_message(word: str) -> str:
    """``unknown command 'compar'; did you mean 'compare'? commands: ...`` (one line)."""
    close = difflib.get_close_matches(word, SUBCOMMANDS, n=1, cutoff=0.6)
    hint = f" did you mean '{close[0]}'?" if close else ""
    return (f"unknown command '{word}';{hint} commands: {', '.join(SUBCOMMANDS)} "
            "(a run takes key=value overrides: servelab [key=value ...])")


def _outside_the_job(exc: Exception) -> str:
    """The line for an error Hydra raised around the job: composing the config, or making the run's folder
    (or its log file there), which names the key that chose the folder."""
    if isinstance(exc, OSError) and exc.filename is not None and not isinstance(exc, HydraException):
        key = "hydra.sweep.dir" if {"-m", "--multirun"} & set(sys.argv) else "hydra.run.dir"
        return f"{key}: cannot write to {exc.filename} ({exc.strerror or type(exc).__name__}); choose a folder you " \
               "can write to"
    return config_error_message(exc)


def check_arguments(argv: list[str]) -> None:
    """Refuse in one line, before Hydra starts, what it would answer in many: an unknown first word
    (a mistyped subcommand), an unknown flag, an override that does not parse, an ``experiment=``
    that does not exist (Hydra skips an optional group's missing option silently)."""
    if argv and not argv[0].startswith(("-", "~", "+")) and "=" not in argv[0]:
        _fail(unknown_command_message(argv[0]))
    parser = get_args_parser()
    parser.exit_on_error = False
    try:
        args, extra = parser.parse_known_args(argv)
    except argparse.ArgumentError as exc:
        _fail(f"{exc} (servelab --hydra-help lists Hydra's flags)")
    flags = [a for a in extra if a.startswith("-")]
    if flags:
        _fail(f"unknown option {flags[0]} (servelab --help; Hydra's flags: servelab --hydra-help)")
    try:
        overrides = OverridesParser.create().parse_overrides(list(args.overrides) + extra)
    except Exception as exc:  # noqa: BLE001 - Hydra's parse errors: one line
        _fail(config_error_message(exc))
    for o in overrides:
        if o.key_or_group == "experiment" and o.package is None and not o.is_delete():
            check_experiment_option([str(v) for v in o.sweep_string_iterator()] if o.is_sweep_override()
                                    else [str(o.value())])


def main() -> None:
    """Register every plugin's config with Hydra, then run a subcommand or compose and run a job."""
    try:
        register_configs()
        check_selection(sys.argv[1:])  # a plugin of a package that failed to import: say so
    except PluginError as exc:
        print(f"servelab: plugin error: {exc}", file=sys.stderr)
        sys.exit(2)
    if any(a in ("--help", "-h") for a in sys.argv[1:2]):
        print(help_text(sys.argv[2:]), end="")  # the usage page with the values the run would use
        sys.exit(0)
    if len(sys.argv) > 1 and sys.argv[1] in SUBCOMMANDS:
        module, func = SUBCOMMANDS[sys.argv[1]].target.split(":")
        try:
            code = getattr(importlib.import_module(f"servelab.{module}"), func)(sys.argv[2:])
        except ServelabError as exc:
            print(f"servelab {sys.argv[1]}: error: {exc}", file=sys.stderr)
            code = 2
        except KeyboardInterrupt:
            print(f"servelab {sys.argv[1]}: interrupted", file=sys.stderr)
            code = 130
        sys.exit(code)
    try:
        check_arguments(sys.argv[1:])
    except ServelabError as exc:
        _fail(str(exc))
    full_error = os.environ.get("HYDRA_FULL_ERROR") == "1"
    if not full_error:  # Hydra then raises its errors here instead of printing them over many lines
        os.environ["HYDRA_FULL_ERROR"] = "1"
        os.environ[_ONE_LINE] = "1"
    try:
        _hydra_main()
    except KeyboardInterrupt:
        _interrupted()
    except Exception as exc:
        if full_error:
            raise
        _fail(_outside_the_job(exc))
    if SweepReport.failed:
        sys.exit(1)
