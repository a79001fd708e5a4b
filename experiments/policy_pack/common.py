"""Helpers shared by the policy-pack reproductions (``vtc.py``, ``mlfq.py``, ``sjf.py``).

Each script runs everything through the Python API in one process (``servelab.api.compose`` +
``servelab.run.session.run_job`` with the script's own seeded requests), writes its results and
plots into ``<out>/<name>/`` and, with ``--update-readme``, rewrites its own section of
``experiments/policy_pack/README.md`` (between ``<!-- <name>:begin -->`` and ``<!-- <name>:end -->``).

Where results go:

- default: a fresh ``multirun/policy_pack/<date>_<time>/<name>/`` (never the committed results);
- ``--out DIR``: ``DIR/<name>/`` (``--out experiments/policy_pack`` replaces the committed ones);
- ``--update-readme``: ``experiments/policy_pack/<name>/`` and the README section.
"""

from __future__ import annotations

import argparse
import csv
import importlib.util
import json
import logging
import os
import platform
import re
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
RUNS = REPO / "multirun" / "policy_pack"
README = HERE / "README.md"


def _experiments_common():
    """``experiments/common.py`` (tables, plots, Agg backend) under another module name: this
    folder's own ``common`` would shadow it."""
    spec = importlib.util.spec_from_file_location("experiments_common", HERE.parent / "common.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


_EC = _experiments_common()
plt = _EC.plt  # matplotlib with the Agg backend: files only
cell, table, save_figure, cpu_model = _EC.cell, _EC.table, _EC.save_figure, _EC.cpu_model

# Llama-3-70B on 8 simulated H100s, on the virtual clock, as experiments/capacity_search prices it.
SIM_70B = ["backend=sim", "clock=virtual", "time_model=auto", "hardware=h100", "model=llama3_70b",
           "tensor_parallel_size=8", "max_model_len=16384"]
# The shipped trained model on this CPU, one torch thread, priced by the committed tiny256 profile.
REAL_TINY = ["model=tiny_code", "clock=virtual", "time_model=profile_tiny256", "backend.num_threads=1"]

# The summary keys a results file keeps per run (the rest stays in the run folder, if kept).
KEEP = ("status", "num_requests", "num_finished", "num_rejected", "duration_s", "num_steps", "output_tokens",
        "prompt_tokens", "output_throughput_tok_s", "request_throughput_req_s", "ttft_ms", "tpot_ms", "e2e_ms",
        "queue_ms", "slo_attainment", "goodput_req_s", "num_preemptions", "num_preemptions_by_kind",
        "recomputed_tokens", "prefill_tokens_computed", "swap_out_bytes", "swap_in_bytes", "kv_utilization_mean",
        "kv_utilization_max", "max_concurrent_requests", "num_kv_blocks", "num_swap_blocks", "leaked_blocks",
        "service_by_client", "max_service_gap_tokens", "jain_fairness_index", "clock", "hardware",
        "tensor_parallel_size")


def quiet() -> None:
    """No per-run start-up lines (hundreds of runs); warnings still show."""
    logging.getLogger("servelab").setLevel(logging.WARNING)


# ---------------------------------------------------------------- arguments and folders

def parse_args(doc: str, name: str, add_arguments=None, argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0], epilog=None,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=None, help=f"results go to OUT/{name}/ (default: a fresh "
                   f"multirun/policy_pack/<date>_<time>/{name}/; the committed ones: --out experiments/policy_pack)")
    p.add_argument("--update-readme", action="store_true", help=f"write experiments/policy_pack/{name}/ and "
                   "rewrite this paper's section of experiments/policy_pack/README.md")
    if add_arguments is not None:
        add_arguments(p)
    args = p.parse_args(argv)
    if args.update_readme:
        args.out_dir = HERE / name
    elif args.out is not None:
        args.out_dir = Path(args.out) / name
    else:
        base = RUNS / datetime.now().strftime("%Y-%m-%d_%H-%M-%S")
        out, n = base, 1
        while out.exists():
            out, n = base.with_name(f"{base.name}-{n}"), n + 1
        args.out_dir = out / name
    args.out_dir.mkdir(parents=True, exist_ok=True)
    return args


# ---------------------------------------------------------------- runs

@dataclass
class Run:
    """One finished run: its label, overrides, the kept summary and the request records."""

    label: str
    overrides: list[str]
    summary: dict
    records: list[dict] = field(repr=False)
    wall_s: float
    time_model: dict | None = None
    predictions: dict[str, float] | None = None  # request id -> the length predictor's answer
    extra: dict = field(default_factory=dict)  # what an ``instrument`` gathered

    def compact(self) -> dict:
        return {"label": self.label, "overrides": self.overrides, "wall_s": round(self.wall_s, 2),
                "summary": {k: self.summary.get(k) for k in KEEP}, **({"extra": self.extra} if self.extra else {})}


def run(label: str, overrides: list[str], requests, *, keep_dir: Path | None = None,
        record_predictions: bool = False, instrument=None) -> Run:
    """One run of ``requests`` (a list of :class:`servelab.core.request.Request`; None: the configured
    workload's) under ``overrides``, on the stack those compose to. ``keep_dir``: write the run folder there
    (``requests.jsonl``, ``summary.json``, ``config.yaml``), else a temporary one.
    ``record_predictions``: also return what the length predictor answered, per request id.
    ``instrument(stack) -> dict``: called on the built stack before the run; the dict it returns
    (filled as the run goes) becomes :attr:`Run.extra`."""
    from servelab.api import compose
    from servelab.run.session import run_job
    from servelab.assemble.stack import build_stack

    cfg = compose(overrides, logger="none", progress=False)
    t0 = time.perf_counter()
    stack = build_stack(cfg)
    predictions: dict[str, float] = {}
    predictor = getattr(stack.engine.scheduler, "length_predictor", None)
    if record_predictions and predictor is not None:
        inner = predictor.predict

        def recording(request, _inner=inner):
            value = _inner(request)
            predictions[request.id] = float(value)
            return value
        predictor.predict = recording
    extra = instrument(stack) if instrument is not None else {}
    try:
        if keep_dir is not None:
            keep_dir.mkdir(parents=True, exist_ok=True)
            result = run_job(cfg, keep_dir, requests=None if requests is None else list(requests), stack=stack)
            records = result.requests
        else:
            with tempfile.TemporaryDirectory(prefix="policy-pack-") as out:
                result = run_job(cfg, out, requests=None if requests is None else list(requests), stack=stack)
                records = result.requests
    finally:
        stack.executor.shutdown()
    wall = time.perf_counter() - t0
    s = result.summary
    if s.get("status") != "completed" or s.get("leaked_blocks"):
        raise SystemExit(f"run {label!r} did not complete cleanly: status {s.get('status')!r}, "
                         f"leaked blocks {s.get('leaked_blocks')}")
    for rec in records:  # the simulator's placeholders and the token ids: not needed here
        rec.pop("output_token_ids", None)
    print(f"  {label:44s} {wall:6.1f} s wall, {s['duration_s']:8.1f} s engine time, "
          f"{s['num_finished']} finished, {s['num_preemptions']} preemptions", flush=True)
    return Run(label, list(overrides), s, records, wall, s.get("time_model"),
               predictions if record_predictions else None, dict(extra))


# ---------------------------------------------------------------- numbers

def lat(records, key: str = "e2e_ms", where=None) -> np.ndarray:
    """``key`` of the finished records (``where(rec)`` true), in ms."""
    return np.array([r[key] for r in records if r.get(key) is not None and (where is None or where(r))], dtype=float)


def mean_p(values: np.ndarray, q: float | None = None) -> float | None:
    if values.size == 0:
        return None
    return float(values.mean() if q is None else np.percentile(values, q))


def kendall_tau_b(x, y) -> float:
    """Kendall's tau-b of two equal-length sequences (ties in either counted as in scipy's
    ``kendalltau``); O(n^2) memory in blocks, fine for a few thousand points."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    n = x.size
    concordant_minus_discordant = 0.0
    ties_x = ties_y = 0.0  # pairs tied in x (resp. y), including pairs tied in both
    block = 512
    for start in range(0, n, block):
        xs, ys = x[start:start + block, None], y[start:start + block, None]
        idx = np.arange(start, min(start + block, n))[:, None]
        upper = np.arange(n)[None, :] > idx  # each unordered pair once
        dx, dy = np.sign(xs - x[None, :]), np.sign(ys - y[None, :])
        concordant_minus_discordant += float((dx * dy)[upper].sum())
        ties_x += float(((dx == 0) & upper).sum())
        ties_y += float(((dy == 0) & upper).sum())
    pairs = n * (n - 1) / 2
    denom = np.sqrt((pairs - ties_x) * (pairs - ties_y))
    return float(concordant_minus_discordant / denom) if denom > 0 else float("nan")


def fmt(v, digits: int = 3) -> str:
    """A number for prose: 3 significant digits, thousands separators from 1000 on."""
    if v is None or (isinstance(v, float) and not np.isfinite(v)):
        return "n/a"
    if abs(v) >= 1000:
        return f"{v:,.0f}"
    return f"{v:.{digits}g}"


def secs(ms) -> str:
    """Milliseconds as seconds for prose (3 significant digits)."""
    return "n/a" if ms is None else f"{fmt(ms / 1e3)} s"


# ---------------------------------------------------------------- where and how it ran

def time_model_note(time_model: dict | None, backend: str) -> str:
    """What priced the steps, from a run's ``summary.json`` ``time_model``."""
    tm = time_model or {}
    if backend == "sim":
        chosen = tm.get("chosen") or tm.get("name")
        tables = (tm.get("tables") or {})
        what = f"`time_model={tm.get('name')}`"
        if chosen and chosen != tm.get("name"):
            what += f" -> `{chosen}`"
        if tables:
            what += f" ({tables.get('hardware')}/{tables.get('model')} op tables, Vidur; the rest calibrated roofline)"
        return what
    if tm.get("path"):
        m = (tm.get("source") or {}).get("machine", {})
        return (f"`time_model=profile` (`{tm['path']}`, measured on {m.get('processor', '?')} x "
                f"{m.get('cores', '?')} cores, 1 torch thread)")
    return f"`time_model={tm.get('name')}`"


def machine_line(total_wall_s: float) -> str:
    import torch

    cpu = cpu_model(platform.processor() or platform.machine())
    return (f"Made {time.strftime('%Y-%m-%d %H:%M')} on {platform.node() or 'an unnamed host'} ({cpu}, "
            f"{os.cpu_count()} CPU cores shared with other jobs, no GPU; Python {platform.python_version()}, "
            f"torch {torch.__version__}) in {total_wall_s / 60:.1f} min wall. Every time in the tables is "
            "engine time on the virtual clock: a deterministic function of config + workload + seed, the "
            "same on any machine (the wall time is not).")


# ---------------------------------------------------------------- files

def write_json(path: Path, obj) -> None:
    path.write_text(json.dumps(obj, indent=1, default=_json_default) + "\n")


def _json_default(o):
    if isinstance(o, (np.floating, np.integer)):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"{type(o).__name__} is not JSON serialisable")


def write_csv(path: Path, headers: list[str], rows: list[list]) -> None:
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(headers)
        for row in rows:
            w.writerow([f"{v:.6g}" if isinstance(v, float) else ("" if v is None else v) for v in row])


PAGE_HEAD = """# Policy pack I: VTC, MLFQ, SJF against their papers

Three reproductions of published claims about the schedulers `vtc`, `mlfq` and `sjf`
([docs/policies.md](../../docs/policies.md)), one command each. Each script builds its workloads
itself (seeded numpy), runs every configuration through the Python API in one process, and writes
its results (`<name>/results.json`, `<name>/*.csv`) and plots (`<name>/*.png`); `--update-readme`
regenerates its own section below and its headline here (the numeric sentences are generated from
the results). Without it a script writes to a fresh `multirun/policy_pack/<date>_<time>/<name>/`
and leaves this page alone.

"""

SECTIONS = ("vtc", "mlfq", "sjf")
TITLES = {"vtc": "VTC (Sheng et al., OSDI'24)", "mlfq": "MLFQ (FastServe, Wu et al. 2023)",
          "sjf": "SJF with length predictors (Fu et al., NeurIPS'24)"}


def _markers(name: str, part: str = "") -> tuple[str, str]:
    tag = f"{name}:{part}" if part else name
    return f"<!-- {tag}:begin -->", f"<!-- {tag}:end -->"


def _replace(page: str, begin: str, end: str, text: str) -> str | None:
    pattern = re.compile(re.escape(begin) + r".*?" + re.escape(end), re.S)
    if not pattern.search(page):
        return None
    return pattern.sub(lambda _: f"{begin}\n{text.strip()}\n{end}", page)


def update_readme(name: str, text: str, headline: str | None = None) -> None:
    """Replace this paper's section of README.md and its headline line (between their markers),
    creating the page, or the markers, where missing."""
    if README.is_file():
        page = README.read_text()
    else:
        page = PAGE_HEAD + "".join(
            f"{_markers(s)[0]}\n_(not generated yet: `python experiments/policy_pack/{s}.py --update-readme`)_\n"
            f"{_markers(s)[1]}\n\n" for s in SECTIONS)
    if _markers(SECTIONS[0], "headline")[0] not in page:  # the headline list, before the first section
        block = "## Headlines\n\n" + "".join(
            f"{_markers(s, 'headline')[0]}\n- **{TITLES[s]}**: _(not generated yet)_\n{_markers(s, 'headline')[1]}\n"
            for s in SECTIONS) + "\n"
        first = page.find(_markers(SECTIONS[0])[0])
        page = page[:first] + block + page[first:] if first >= 0 else page.rstrip() + "\n\n" + block
    text = f'<a id="{name}"></a>\n\n{text.strip()}'
    new = _replace(page, *_markers(name), text)
    page = new if new is not None else page.rstrip() + "\n\n" + "\n".join((*_markers(name)[:1], text.strip(),
                                                                           _markers(name)[1])) + "\n"
    if headline:
        page = _replace(page, *_markers(name, "headline"), f"- **{TITLES[name]}** ([below](#{name})): {headline}") or page
    README.write_text(page)
    print(f"rewrote the {name} section of {README}", flush=True)


def finish(args, name: str, text: str, headline: str | None = None) -> None:
    """With --update-readme, the section (and headline) go into README.md; otherwise to
    ``<out>/section.md``."""
    if args.update_readme:
        update_readme(name, text, headline)
    else:
        (args.out_dir / "section.md").write_text((f"Headline: {headline}\n\n" if headline else "") + text.strip() + "\n")
        print(f"results in {args.out_dir} (the committed page: rerun with --update-readme)", flush=True)
