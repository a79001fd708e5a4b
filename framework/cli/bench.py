"""``servelab bench``: the latency-throughput curve of any stack in one command.

    servelab bench backend=sim model=llama3_8b hardware=h100 workload=synthetic workload.num_requests=500 \\
        bench.concurrencies=[1,4,16,64] slo.ttft_ms=200 logger=none
    servelab bench backend=sim model=llama3_8b workload=synthetic bench.rates=[1,2,4,8] slo.tpot_ms=50

Every other argument is an ordinary override of the stack. One run per load point: Poisson
arrivals at each of ``bench.rates`` (req/s), or closed-loop clients at each of
``bench.concurrencies`` (``workload.arrival=closed_loop``), in increasing load, in this process
through the same ``run_job`` a run uses. Each point's folder (``<i>_rate=<r>`` /
``<i>_concurrency=<n>``) holds the usual ``summary.json`` and ``requests.jsonl``, so ``servelab
compare <bench folder>`` reads the points as rows. The bench folder (``hydra.run.dir``, else
``bench.output_dir``, else ``outputs/bench/<date>/<time>``) also gets ``curve.csv``, ``curve.png``,
``knee.json`` and ``bench.yaml`` (the composed config). A point that fails is marked in
``curve.csv`` (its ``status``) and in its folder's ``error.txt``; the others still run, and the
command exits 1 at the end (0 when every point completed; 2 on bad input, before any point).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from servelab.api import command_output_dir, compose_with_run_dir
from servelab.cli.bench_curve import PERCENTILES, curve_row, knee, plot_curve, slo_holds, write_curve_csv
from servelab.cli.args import refuse_flags
from servelab.cli.help import plain_doc
from servelab.core.errors import ConfigError, ServelabError
from servelab.config import ERROR_FILE, check_known_keys
from servelab.results.writable import writable_folder

USAGE = ("usage: servelab bench [key=value ...] bench.rates=[r1,r2,...] | bench.concurrencies=[n1,n2,...]  "
         "(bench.percentile=90, slo.ttft_ms=, slo.tpot_ms=; hydra.run.dir=DIR)")
# bench.<key> -> (the load kind, the workload settings of one point at load x)
LOADS = {
    "rates": ("rate", lambda x: {"arrival": "poisson", "rate": float(x), "concurrency": None}),
    "concurrencies": ("concurrency", lambda x: {"arrival": "closed_loop", "concurrency": int(x)}),
}


def main(argv: list[str]) -> int:
    if any(a in ("-h", "--help") for a in argv):
        print(USAGE + "\n\n" + plain_doc(__doc__))
        return 0
    refuse_flags(argv, "bench")
    cfg, run_dir = compose_with_run_dir(argv)
    check_known_keys(cfg)
    key, values = load_points(cfg)
    out = command_output_dir("bench", run_dir, cfg.bench.output_dir)
    writable_folder(out, f"hydra.run.dir={run_dir}" if run_dir else f"bench.output_dir={cfg.bench.output_dir}"
                    if cfg.bench.output_dir else "the bench folder")
    OmegaConf.save(cfg, out / "bench.yaml")  # not config.yaml: compare would take the bench folder for one run
    return run_bench(cfg, key, values, out)


def load_points(cfg: DictConfig) -> tuple[str, list[float]]:
    """``("rates" | "concurrencies", the values in increasing order)``; a mistake is one line."""
    given = {k: list(cfg.bench[k]) for k in LOADS if cfg.bench[k] is not None}
    if len(given) != 1:
        raise ConfigError("servelab bench needs exactly one of bench.rates=[...] (Poisson, req/s) or "
                          f"bench.concurrencies=[...] (closed-loop clients); got {sorted(given) or 'neither'}")
    (key, values), = given.items()
    if not values:
        raise ConfigError(f"bench.{key}=[]: give at least one load point")
    low = 1 if key == "concurrencies" else 0
    bad = [v for v in values if (v < low if low else v <= 0)]
    if bad:
        raise ConfigError(f"bench.{key}: {bad[0]} is not a load ({'each >= 1' if low else 'each > 0'})")
    if len(set(values)) != len(values):
        raise ConfigError(f"bench.{key}={values}: a load point is given twice")
    if "arrival" not in cfg.workload:
        raise ConfigError(f"bench.{key} sets workload.arrival, which workload={cfg.workload.name} has not: use "
                          "workload=synthetic, corpus or prompts")
    if key == "rates" and "rate" not in cfg.workload:
        raise ConfigError(f"bench.rates sets workload.rate, which workload={cfg.workload.name} has not")
    if not 0 < cfg.bench.percentile <= 100:
        raise ConfigError(f"bench.percentile={cfg.bench.percentile} must be in (0, 100]")
    return key, sorted(values)


def point_config(cfg: DictConfig, key: str, value: float) -> DictConfig:
    """``cfg`` with the workload's arrivals at load ``value``."""
    point = cfg.copy()
    for field, setting in LOADS[key][1](value).items():
        point.workload[field] = setting
    return point


def run_bench(cfg: DictConfig, key: str, values: list[float], out: Path) -> int:
    """Run every point, write the curve files, print the table and the knee; the exit code."""
    from servelab.run.session import run_job  # noqa: PLC0415 - torch on demand

    kind = LOADS[key][0]
    rows: list[dict] = []
    verdicts: list[tuple[bool, str]] = []
    slo = {"ttft_ms": cfg.slo.ttft_ms, "tpot_ms": cfg.slo.tpot_ms}
    for i, value in enumerate(values):
        folder = out / f"{i}_{kind}={value:g}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / ERROR_FILE).unlink(missing_ok=True)
        print(f"bench: point {i + 1} of {len(values)}: {kind}={value:g} -> {folder}", flush=True)
        try:
            summary = run_job(point_config(cfg, key, value), folder).summary
            status = str(summary.get("status", "completed"))
        except KeyboardInterrupt:  # Ctrl-C: the finished points' curve, then the folder, then exit 130
            return _interrupted(rows, verdicts, slo, cfg.bench.percentile, out, folder, len(values))
        except Exception as exc:  # noqa: BLE001 - a failed point is marked; the others still run
            line = " ".join(f"{type(exc).__name__}: {exc}".split()) if not isinstance(exc, ServelabError) else \
                " ".join(str(exc).split())
            status = f"failed: {line}"
            (folder / ERROR_FILE).write_text(status + "\n")
            summary = _summary_if_written(folder)
            print(f"servelab bench: error: {kind}={value:g}: {line}", file=sys.stderr, flush=True)
        rows.append(curve_row(i, folder, kind, value, status, summary))
        verdicts.append(slo_holds(folder, summary, status, slo, cfg.bench.percentile)
                        if status == "completed" else (False, status))
    result = _write_curve(rows, verdicts, slo, cfg.bench.percentile, out)
    _print_table(rows, result)
    failed = [r for r in rows if r["status"] != "completed"]
    if failed:
        print(f"servelab bench: error: {len(failed)} of {len(rows)} points failed: "
              + "; ".join(f"{r['folder']} ({r['status']})" for r in failed), file=sys.stderr, flush=True)
    print(f"results: {out}", flush=True)
    return 1 if failed else 0


def _write_curve(rows: list[dict], verdicts: list[tuple[bool, str]], slo: dict, percentile: float,
                 out: Path) -> dict:
    """``curve.csv``, ``knee.json`` and ``curve.png`` of ``rows``; the knee."""
    result = knee(rows, verdicts, slo, percentile)
    write_curve_csv(rows, out / "curve.csv")
    (out / "knee.json").write_text(json.dumps(result, indent=2) + "\n")
    plot_curve(rows, slo, out / "curve.png")
    return result


def _interrupted(rows: list[dict], verdicts: list[tuple[bool, str]], slo: dict, percentile: float, out: Path,
                 cut: Path, num_points: int) -> int:
    """Ctrl-C during a point: the curve of the points that finished (none: no curve files), one line
    saying what was kept, ``results: <bench folder>``; exit 130. The interrupted point's folder keeps
    its partial run (the run writes it as any interrupted run does) but is no point of the curve."""
    if rows:
        result = _write_curve(rows, verdicts, slo, percentile, out)
        kept = (f"curve.csv, knee.json and curve.png of the {len(rows)} finished points written to {out} "
                f"({result['message']})")
    else:
        kept = f"no point finished: no curve; {out} holds bench.yaml"
    print(f"servelab bench: interrupted at point {len(rows) + 1} of {num_points} ({cut.name}: partial, not in the "
          f"curve); {kept}", file=sys.stderr, flush=True)
    print(f"results: {out}", flush=True)
    return 130


def _summary_if_written(folder: Path) -> dict:
    """A failed run's partial ``summary.json`` (the session writes one when the run itself failed), else {}."""
    try:
        return json.loads((folder / "summary.json").read_text())
    except (OSError, ValueError):
        return {}


def _print_table(rows: list[dict], result: dict) -> None:
    from rich.console import Console  # noqa: PLC0415 - rich
    from rich.table import Table  # noqa: PLC0415

    def fmt(v) -> str:
        if v is None:
            return "n/a"
        if isinstance(v, bool):
            return "yes" if v else "no"
        return f"{v:,.4g}" if isinstance(v, float) else str(v)

    kind = rows[0]["load_kind"]
    table = Table(title="servelab bench (latencies in ms; every figure in curve.csv)")
    columns = [(kind, "load"), ("req/s", "request_throughput_req_s"), ("tok/s", "output_throughput_tok_s"),
               *((f"{m.split('_')[0].upper()} {p}", f"{m}_{p}") for m, ps in
                 (("ttft_ms", PERCENTILES), ("tpot_ms", ("p50", "p90")), ("e2e_ms", ("p50", "p90"))) for p in ps),
               ("SLO att.", "slo_attainment"), ("SLO holds", "slo_holds"), ("status", "status")]
    for title, _ in columns:
        table.add_column(title, justify="left" if title == "status" else "right")
    for row in rows:
        table.add_row(*(fmt(row[k]) for _, k in columns))
    console = Console()
    if not console.is_terminal:  # a log file or a pipe: the whole table, not rich's 80 columns
        console = Console(width=180)
    console.print(table)
    print(result["message"], flush=True)
