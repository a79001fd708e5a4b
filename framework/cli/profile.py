"""``servelab profile [overrides]``: fit a step-time profile of the real engine on this machine.

It runs a standard probe workload through the configured stack on the wall clock (prompts
alone, decode batches of 1 .. ``max_num_seqs`` over growing contexts, a mixed Poisson load, long
prompts chunked under a small prefill cap beside decodes) ``--rounds`` times, prices each distinct step by the median of its measurements (a burst
of other work on a shared machine then moves one round, not the profile), fits
:mod:`servelab.sim.step_profile`'s piecewise-linear model and writes ``profile.json`` with where it
came from, to ``hydra.run.dir`` (``--out=FILE`` names the file instead; default
``outputs/profile/<date>/<time>/profile.json``). ``time_model=profile time_model.path=<file>``
then prices steps with it on the virtual clock.
"""

from __future__ import annotations

import datetime as dt
import logging
import sys
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import torch

from servelab.cli.args import refuse_flags
from servelab.cli.help import plain_doc
from servelab.api import command_output_dir, compose, compose_with_run_dir
from servelab.core.errors import ConfigError
from servelab.core.request import Request
from servelab.core.shapes import ModelShape
from servelab.run.runner import run_workload
from servelab.assemble.stack import build_stack
from servelab.results.writable import writable_file
from servelab.sim.step_profile import StepProfile, feature_vector, fit_profile, machine_description

log = logging.getLogger(__name__)
USAGE = "usage: servelab profile [--out=FILE] [--rounds=N (3)] [hydra overrides...]  (hydra.run.dir=DIR: DIR/profile.json)"


def probe_requests(vocab_size: int, max_num_seqs: int, max_model_len: int, max_num_batched_tokens: int,
                   seed: int = 0) -> list[list[Request]]:
    """Phases of the standard probe: one list of requests per phase, each run to the end."""
    rng = np.random.default_rng(seed)
    phases = []
    length = 16
    while length <= min(max_num_batched_tokens, max_model_len - 1):  # prefill alone, one prompt per step
        phases.append([Request(f"p{length}-{r}", tuple(rng.integers(0, vocab_size, size=length).tolist()), 1,
                               arrival_time=0.001 * r) for r in range(3)])
        length *= 2
    short, long_ = (16, 64), (256, max(257, min(1024, max_model_len // 2)))
    batch = 1
    while batch <= max_num_seqs:  # decode at every batch size, over short and long contexts
        for lo, hi in (short, long_):
            prompts = rng.integers(lo, hi, size=batch)
            phases.append([Request(f"b{batch}-{lo}-{i}", tuple(rng.integers(0, vocab_size, size=int(p)).tolist()), 24)
                           for i, p in enumerate(prompts)])
        batch *= 2
    n = max(8, max_num_seqs)
    arrivals = np.cumsum(rng.exponential(0.02, size=n))
    prompts = rng.integers(16, max(17, min(1024, max_model_len // 2)), size=n)
    outputs = rng.integers(8, 64, size=n)
    phases.append([Request(f"mix-{i}", tuple(rng.integers(0, vocab_size, size=int(p)).tolist()), int(o),
                           arrival_time=float(a)) for i, (p, o, a) in enumerate(zip(prompts, outputs, arrivals))])
    return phases


def chunked_probe_requests(vocab_size: int, max_model_len: int, seed: int = 0) -> list[Request]:
    """The probe's chunked-prefill phase: long prompts arriving while others decode, run with a
    small prefill cap (:data:`CHUNK_CAP`), so chunks attend to the context of earlier chunks and
    share steps with decodes, as under ``max_num_batched_tokens`` of a few hundred."""
    rng = np.random.default_rng(seed + 1)
    hi = min(1200, max_model_len - 32)  # room for the 24 outputs
    prompts = rng.integers(min(hi - 1, 2 * CHUNK_CAP), hi, size=8)
    return [Request(f"c{i}", tuple(rng.integers(0, vocab_size, size=int(p)).tolist()), 24, arrival_time=0.04 * i)
            for i, p in enumerate(prompts)]


CHUNK_CAP = 256  # prefill tokens per step in the chunked phase


def median_per_step(works: list, seconds: list[float]) -> tuple[list, list[float]]:
    """One sample per distinct step (the same work, measured once per round): its median time.
    Steps seen once (the Poisson phase's mixes) keep their one measurement."""
    groups: dict = {}
    for work, s in zip(works, seconds):
        groups.setdefault(work, (work, []))[1].append(s)
    return [w for w, _ in groups.values()], [float(np.median(t)) for _, t in groups.values()]


def measure_profile(overrides: list[str], rounds: int = 3, after_round=None) -> StepProfile:
    """Run the probe ``rounds`` times on the stack ``overrides`` compose and fit a profile to the
    median of each distinct step. ``after_round(r)`` runs after round ``r`` (an experiment that
    interleaves its own wall-clock runs with the rounds, so both sample the machine alike)."""
    cfg = compose(overrides + ["clock=wall", "time_model=measured"], logger="none", progress=False)
    if cfg.backend.name == "sim":
        raise ConfigError("servelab profile measures the real engine: backend=sim has nothing to measure")
    stack = build_stack(cfg)
    try:
        swap_bytes_per_s = stack.executor.measure_swap_bandwidth()
        times = _StepTimes(stack.engine)
        phases, chunked = _probe_phases(cfg, stack)
        _run_probe(stack.engine, phases, chunked, rounds, times, after_round)
    finally:
        stack.executor.shutdown()
    works, seconds = median_per_step(times.works, times.seconds)
    profile = fit_profile(works, seconds, source=_source(cfg, stack, overrides, rounds, len(times.works)))
    # The probe never preempts, so block copies are priced from a measured copy, not fitted: a
    # swap moves a block over the host link, a copy-on-write a block within device memory.
    per_block = stack.executor.bytes_per_block / max(swap_bytes_per_s, 1.0)
    profile.set_coefficient("swap_blocks", per_block)
    profile.set_coefficient("copy_blocks", per_block)
    profile.source["swap_bytes_per_s"] = swap_bytes_per_s
    profile.samples = [[*feature_vector(w, profile.knots, profile.decode_knots), t] for w, t in zip(works, seconds)]
    return profile


class _StepTimes:
    """Each step's cost, from the engine's step records: the interval from its start to the next
    step's start when they follow back to back (the engine's own work between steps counts, as on
    a virtual clock). The first steps (lazy initialisation) and steps before an idle wait are left out."""

    def __init__(self, engine, warmup: int = 2) -> None:
        self.works: list = []
        self.seconds: list[float] = []
        self.warmup = warmup
        self.previous = None  # the last step's record; None at the start of a phase (after a pause)
        self.idle = False
        self._engine_sleep = engine.sleep
        engine.step_listeners.append(self.keep)

    def sleep(self, s: float) -> None:  # an idle wait between two steps: the first one's interval is not a step's cost
        self.idle = True
        self._engine_sleep(s)

    def keep(self, record) -> None:
        prev = self.previous
        if prev is not None and prev.step >= self.warmup and not self.idle:
            self.works.append(prev.work)
            self.seconds.append((record.time_s - record.duration_s) - (prev.time_s - prev.duration_s))
        self.previous, self.idle = record, False


def _probe_phases(cfg, stack) -> tuple[list[list[Request]], int | None]:
    """The probe's phases, and the index of the chunked-prefill one (None when it does not run)."""
    vocab_size, max_model_len = stack.executor.spec.vocab_size, stack.limits.max_model_len
    phases = probe_requests(vocab_size, cfg.max_num_seqs, max_model_len, cfg.max_num_batched_tokens, cfg.seed)
    if (hasattr(stack.engine.scheduler, "prefill_token_cap") and CHUNK_CAP < cfg.max_num_batched_tokens
            and max_model_len > 2 * CHUNK_CAP + 32):
        phases.append(chunked_probe_requests(vocab_size, max_model_len, cfg.seed))
        return phases, len(phases) - 1
    return phases, None  # no QueueScheduler hook, steps that small already, or no room for chunked prompts


def _run_probe(engine, phases: list[list[Request]], chunked: int | None, rounds: int, times: _StepTimes,
               after_round=None) -> None:
    """Every phase, ``rounds`` times, each to the end; ``times`` records the steps."""
    scheduler = engine.scheduler
    for r in range(rounds):
        for i, phase in enumerate(phases):
            print(f"servelab profile: round {r + 1}/{rounds}, phase {i + 1}/{len(phases)}: {len(phase)} requests",
                  file=sys.stderr)
            if i == chunked:  # the QueueScheduler hook a policy uses to cap prefill, for this phase only
                scheduler.prefill_token_cap = lambda now: CHUNK_CAP
            run_workload(engine, [replace(req, id=f"{req.id}.{r}") for req in phase], sleep=times.sleep)
            scheduler.__dict__.pop("prefill_token_cap", None)
            times.previous = None  # the next phase starts after a pause
        if after_round is not None:
            after_round(r)


def _source(cfg, stack, overrides: list[str], rounds: int, num_measured: int) -> dict:
    """Where the profile came from: model, backend, machine, the probe's size."""
    return {
        "model": cfg.model.name if cfg.model.path is None else str(cfg.model.path),
        "dtype": str(getattr(cfg.model.dtype, "value", cfg.model.dtype)),
        "backend": cfg.backend.name, "device": str(stack.executor.describe().get("device")),
        "attention_backend": str(getattr(cfg.attention_backend, "value", cfg.attention_backend)),
        "num_threads": torch.get_num_threads(), "tensor_parallel_size": cfg.tensor_parallel_size,
        "block_size": cfg.block_size, "max_num_seqs": cfg.max_num_seqs, "overrides": overrides,
        "shape": asdict(ModelShape.from_spec(stack.executor.spec)),
        "machine": machine_description(), "created": dt.datetime.now().isoformat(timespec="seconds"),
        "rounds": rounds, "measured_steps": num_measured,
    }


def profile_main(argv: list[str]) -> int:
    out = None
    rounds = 3
    overrides = []
    for arg in argv:
        if arg in ("-h", "--help"):
            print(USAGE + "\n\n" + plain_doc(__doc__))
            return 0
        if arg.startswith("--out="):
            out = Path(arg.split("=", 1)[1])
        elif arg.startswith("--rounds="):
            rounds = int(arg.split("=", 1)[1]) if arg.split("=", 1)[1].isdigit() else 0
            if rounds < 1:
                raise ConfigError(f"servelab profile: {arg} must be a positive integer")
        else:
            overrides.append(arg)
    refuse_flags(overrides, "profile", takes="--out=FILE, --rounds=N")
    _, run_dir = compose_with_run_dir(overrides)  # where it goes, and bad overrides as one line before the probe runs
    option = f"hydra.run.dir={run_dir}" if run_dir else f"--out={out}" if out is not None else "the profile folder"
    if run_dir or out is None:
        out = command_output_dir("profile", run_dir) / "profile.json"
    writable_file(out, option)  # before the probe (minutes)
    profile = measure_profile(overrides, rounds)
    source = profile.source
    profile.save(out)
    fit = profile.fit
    print(f"servelab profile: {source['measured_steps']} steps measured in {rounds} round(s), {fit['num_steps']} distinct "
          f"({fit['total_s']:.1f} s of medians) fitted: R^2 {fit['r2']:.3f}, "
          f"mean |error| {fit['mean_abs_pct_error']:.1%} per step, {fit['total_time_error']:+.1%} in total")
    print("use it: python run.py clock=virtual time_model=profile time_model.path="
          f"{out.resolve()} " + " ".join(o for o in overrides if not o.lstrip("+").startswith("hydra.")))
    print(f"results: {out}")
    return 0
