"""Python API for notebooks and assignments.

    import servelab
    lab = servelab.LLM(["scheduler=fcfs", "block_size=16"], logger="none")
    lab.add_request([1, 2, 3], max_tokens=8)
    while lab.has_unfinished():
        lab.step()
    result = lab.results()          # the same RunResult the CLI writes (requests + summary)
    result = lab.run()              # or: run the configured workload on the wall clock
"""

from __future__ import annotations

import functools
import heapq
import itertools
import os
from datetime import datetime
from importlib import resources
from pathlib import Path
from typing import Any, Sequence as Seq

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import yaml
from hydra import compose as hydra_compose, initialize_config_module
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

from servelab.config import config_error_message, register_configs
from servelab.core.errors import ConfigError
from servelab.core.registry import check_selection
from servelab.core.request import Request, SamplingParams
from servelab.engine.engine import Engine
from servelab.cluster.build import is_cluster, validate_cluster
from servelab.run.runner import run_workload
from servelab.run.session import RunResult, collect_results, run_job
from servelab.assemble.stack import Stack, build_stack, run_arrivals
from servelab.assemble.validate import validate
from servelab.workloads.text import attach_text, checkpoint_text


def compose(overrides: Seq[str] = (), **values: Any) -> DictConfig:
    """Compose the config exactly as ``python run.py <overrides>`` would (Hydra compose API). A mistake
    is a :class:`~servelab.core.errors.ConfigError` with the command line's one line (an unknown key
    with the closest names, an unknown option with the options, a value of the wrong type).

    Keyword arguments are extra ``key=value`` overrides (``logger="none"``); nested keys use
    ``__``, e.g. ``workload__num_requests=8``.
    """
    return compose_with_run_dir(overrides, **values)[0]


def compose_with_run_dir(overrides: Seq[str] = (), **values: Any) -> tuple[DictConfig, str | None]:
    """:func:`compose`, and the run folder that ``hydra.run.dir=...`` (an override or a preset the
    overrides select) sets, resolved; None where it is left at ``conf/config.yaml``'s default.

    ``run.py`` gets its run folder from Hydra itself; the subcommands compose through this API, which
    applies no ``hydra.*`` setting, so they read it here (:func:`command_output_dir`)."""
    register_configs()
    extra = [f"{k.replace('__', '.')}={_render(v)}" for k, v in values.items()]
    check_selection(list(overrides) + extra)
    try:
        with initialize_config_module("servelab.conf", version_base="1.3"):
            cfg = hydra_compose("config", overrides=list(overrides) + extra, return_hydra_config=True)
    except (HydraException, OmegaConfBaseException) as exc:  # the command line's one line, not Hydra's trace
        raise ConfigError(config_error_message(exc)) from None
    run_dir = None
    if cfg.hydra.run._get_node("dir")._value() != _default_run_dir():
        run_dir = str(OmegaConf.select(cfg, "hydra.run.dir"))
    with open_dict(cfg):
        del cfg["hydra"]  # what compose(return_hydra_config=False) returns
    return cfg, run_dir


@functools.lru_cache(maxsize=1)
def _default_run_dir() -> str:
    """``hydra.run.dir`` as ``conf/config.yaml`` writes it (unresolved)."""
    text = (resources.files("servelab.conf") / "config.yaml").read_text()
    return yaml.safe_load(text)["hydra"]["run"]["dir"]


def command_output_dir(command: str, run_dir: str | Path | None = None, alias: str | Path | None = None) -> Path:
    """Where ``servelab <command>`` writes: ``hydra.run.dir`` (``run_dir``, from
    :func:`compose_with_run_dir`), else the command's own alias (``serve.output_dir``,
    ``eval_ppl.output_dir``, ``profile --out``'s folder), else ``outputs/<command>/<date>/<time>``.
    Not created here."""
    if run_dir:
        return Path(run_dir)
    if alias:
        return Path(alias)
    return Path("outputs") / command / datetime.now().strftime("%Y-%m-%d/%H-%M-%S")


def _render(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


class LLM:
    """A built stack you can feed requests and step by hand, or run on a workload.

    A cluster config (``cluster.replicas`` > 1, or prefill/decode pools) runs only as a whole:
    :meth:`run` runs it through its router (as ``run.py`` does); the one-engine methods
    (:meth:`add_request`, :meth:`step`, :meth:`results`, :meth:`generate`) refuse it in one line."""

    def __init__(self, overrides: Seq[str] | DictConfig = (), **values: Any) -> None:
        self.cfg = overrides if isinstance(overrides, DictConfig) else compose(overrides, **values)
        self.stack: Stack | None = None
        if is_cluster(self.cfg):  # run() builds the replicas; a bad cluster.* key fails here, as one engine's would
            validate(self.cfg)
            validate_cluster(self.cfg)
        else:
            self.stack = build_stack(self.cfg)
        self.text = checkpoint_text(self.cfg)  # the checkpoint's tokenizer (loaded on first use)
        self._counter = 0
        # requests added with an arrival still to come: (arrival, order, request), earliest first
        self._pending: list[tuple[float, int, Request]] = []
        self._pending_order = itertools.count()

    @property
    def engine(self) -> Engine:
        """The one engine (a cluster config has none: :class:`~servelab.core.errors.ConfigError`)."""
        if self.stack is None:
            c = self.cfg.cluster
            pools = (f"cluster.replicas={c.replicas}" if c.prefill_replicas is None
                     else f"cluster.prefill_replicas={c.prefill_replicas} cluster.decode_replicas={c.decode_replicas}")
            raise ConfigError(f"{pools}: LLM.add_request/step/results/generate drive one engine and a cluster runs "
                              "only as a whole: use LLM.run() (or run.py), or leave cluster.* at its default")
        return self.stack.engine

    def add_request(self, prompt: str | Seq[int], max_tokens: int, *, id: str | None = None,
                    arrival_time: float = 0.0, temperature: float = 0.0, top_p: float = 1.0, top_k: int = 0,
                    seed: int | None = None, ignore_eos: bool | None = None, priority: int = 0,
                    ttft_slo_ms: float | None = None, tpot_slo_ms: float | None = None,
                    cache_salt: str | None = None, client_id: str | None = None) -> str:
        """Add one request (it is rejected, with a reason in its result, if it can never run).
        ``client_id``: who sent it (``scheduler=vtc`` shares service between clients).

        ``arrival_time`` is in seconds on the engine's clock (0 = when the LLM was built). A request
        whose arrival is still to come is held here and reaches the engine at its arrival:
        :meth:`step` hands over every request that has arrived, and when nothing else is left to
        run it waits for the next arrival first (the simulator's virtual clock jumps there; the
        wall clock sleeps), so no request runs before it arrives and no latency is negative.

        ``prompt`` is token ids, or a string tokenized with the checkpoint's tokenizer. Token ids
        ignore EOS unless ``ignore_eos=False``; a string stops at EOS unless ``ignore_eos=True``."""
        engine = self.engine
        rid = id or f"req-{self._counter}"
        self._counter += 1
        prompt_token_ids: Seq[int]
        if isinstance(prompt, str):
            prompt_token_ids = self.text.encode(prompt, f"add_request(id={rid!r})")
            ignore_eos = False if ignore_eos is None else ignore_eos
        else:
            prompt_token_ids = prompt
            ignore_eos = True if ignore_eos is None else ignore_eos
        request = Request(rid, tuple(prompt_token_ids), max_tokens, arrival_time,
                          SamplingParams(temperature, top_p, top_k, seed), ignore_eos, priority,
                          ttft_slo_ms, tpot_slo_ms, cache_salt, client_id)
        if arrival_time > engine.now():
            if rid in engine.sequences or any(r.id == rid for _, _, r in self._pending):
                raise ValueError(f"duplicate request id {rid!r}")
            heapq.heappush(self._pending, (arrival_time, next(self._pending_order), request))
        else:
            engine.add_request(request)
        return rid

    def step(self):
        """Run one engine step; returns its StepRecord (None if nothing could run). Requests that
        have arrived join first; with nothing left to run, it first waits (virtual clock: jumps)
        for the next request still to arrive."""
        engine, pending = self.engine, self._pending
        if pending and not engine.has_unfinished():
            while (wait := pending[0][0] - engine.now()) > 0:  # the wall clock naps in slices
                engine.sleep(wait)
        while pending and pending[0][0] <= engine.now():
            engine.add_request(heapq.heappop(pending)[2])
        return engine.step() if engine.has_unfinished() else None

    def has_unfinished(self) -> bool:
        """Whether a request added is still to arrive, waiting, or running."""
        return bool(self._pending) or self.engine.has_unfinished()

    def results(self) -> RunResult:
        """Results of every request added so far (the objects the CLI writes)."""
        engine = self.engine
        result = collect_results(engine, 1.0, "completed" if not self.has_unfinished() else "partial")
        attach_text(result.requests, engine.sequences, self.text)
        return result

    def generate(self, requests: Seq[Request]) -> RunResult:
        """Run ``requests`` to completion, honouring their arrival times (or, with
        ``workload.arrival=closed_loop``, sent by ``workload.concurrency`` clients in their order)."""
        run_workload(self.engine, requests, self.cfg.workload.time_scale,
                     arrivals=run_arrivals(self.cfg, requests))
        return self.results()

    def run(self, output_dir: str | Path | None = None, requests: Seq[Request] | None = None) -> RunResult:
        """Run the configured workload (or ``requests``) like the CLI, writing the result files, and
        print where they are (``results: ...``, the CLI's last line). A cluster config runs its
        replicas through the router, each built for this run and shut down after it."""
        output_dir = Path(output_dir or Path("outputs") / "api")
        result = run_job(self.cfg, output_dir, list(requests) if requests is not None else None, stack=self.stack)
        print(f"results: {output_dir}/requests.jsonl, summary.json", flush=True)
        return result

    def close(self) -> None:
        if self.stack is not None:
            self.stack.executor.shutdown()

    def __enter__(self) -> "LLM":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
