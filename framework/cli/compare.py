"""``servelab compare``: runs side by side.

    servelab compare multirun/2026-11-30/12-00-00                  # every job of a multirun
    servelab compare outputs/a outputs/b --metrics ttft_ms.p99,goodput_req_s --out cmp.md
    servelab compare multirun/x --format csv > sweep.csv           # plain CSV (or markdown)
    servelab compare multirun/x --plot ttft_ms.p99 --x workload.rate   # PNG in the sweep folder

Each run is labelled by the config keys whose values differ between the runs (what the sweep or
the user changed; ``scheduler`` for ``scheduler.name``; keys that follow from a differing group
option, e.g. the shape fields of ``model=...``, are left out), then the chosen metrics
(``summary.json`` keys; ``.`` reaches into objects, e.g. ``ttft_ms.p99``; see docs/metrics.md).
A default metric that is n/a in every run is dropped. One row per run, or one row per metric
when there are more than 6 metrics and no more runs than metrics (``--layout``). On a terminal
a table (rich); piped or redirected, Markdown (``--format table|markdown|csv`` chooses; CSV is
always one row per run, with the run's folder). ``--out FILE.csv|.md`` also writes it;
``--plot METRIC --x KEY`` draws the metric against a swept key, one line per combination of the
other differing keys.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml
from rich.console import Console
from rich.table import Table

from servelab.core.errors import ServelabError

DEFAULT_METRICS = ("num_finished", "num_rejected", "output_throughput_tok_s", "ttft_ms.p50", "ttft_ms.p99",
                   "tpot_ms.p50", "slo_attainment", "goodput_req_s", "num_preemptions", "prefix_cache_hit_rate",
                   "leaked_blocks")
# differ between every run yet say nothing about what was compared
_NOISE = ("hydra", "logger", "progress", "eval_ppl")
MANY_METRICS = 6  # more metrics than this (and no more runs than metrics): one row per metric
FORMATS = ("table", "markdown", "csv")
LAYOUTS = ("auto", "runs", "metrics")


class CompareError(ServelabError):
    """A bad argument or folder, named in one line."""


def find_runs(paths: list[str | Path]) -> list[Path]:
    """Run folders (with ``summary.json``): each path is one, or a folder holding some (a multirun)."""
    runs: list[Path] = []
    for p in map(Path, paths):
        if (p / "summary.json").is_file():
            runs.append(p)
        elif p.is_dir():
            found = sorted((d for d in p.iterdir() if (d / "summary.json").is_file()),
                           key=lambda d: (_job_number(d), d.name))
            if not found:
                raise CompareError(f"{p}: no run folders (no */summary.json) in it")
            runs.extend(found)
        else:
            raise CompareError(f"{p}: no such folder")
    return runs


def _job_number(d: Path) -> int:
    head = d.name.split("_", 1)[0]
    return int(head) if head.isdigit() else 1 << 30


def _flatten(d, prefix: str = "") -> dict:
    out = {}
    for k, v in (d or {}).items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(_flatten(v, key + "."))
        else:
            out[key] = v
    return out


def load_run(path: Path) -> dict:
    """``{"path", "config" (flat), "summary" (flat)}`` of one run folder."""
    try:
        summary = json.loads((path / "summary.json").read_text())
    except ValueError as exc:
        raise CompareError(f"{path / 'summary.json'}: not valid JSON ({exc})") from None
    config_file = path / "config.yaml"
    config = yaml.safe_load(config_file.read_text()) if config_file.is_file() else {}
    return {"path": path, "config": _flatten(config), "summary": _flatten(summary)}


def differing_keys(runs: list[dict]) -> list[str]:
    """Config keys whose values are not the same in every run (in config order)."""
    keys: dict[str, None] = {}
    for r in runs:
        keys.update(dict.fromkeys(r["config"]))
    return [k for k in keys if not k.startswith(_NOISE)
            and len({json.dumps(r["config"].get(k), sort_keys=True) for r in runs}) > 1]


def label_keys(runs: list[dict], keys: list[str]) -> list[str]:
    """``keys`` less those a differing group option decides: ``model.hidden_size`` goes when
    ``model.name`` differs too and each model name has one hidden size in these runs."""
    def decided(key: str) -> bool:
        group = key.split(".", 1)[0]
        name = f"{group}.name"
        if "." not in key or key == name or name not in keys:
            return False
        seen: dict[str, str] = {}
        for r in runs:
            option, value = json.dumps(r["config"].get(name)), json.dumps(r["config"].get(key), sort_keys=True)
            if seen.setdefault(option, value) != value:
                return False
        return True

    return [k for k in keys if not decided(k)]


def short_key(key: str) -> str:
    """``scheduler.name`` -> ``scheduler`` (what the user typed: ``scheduler=fcfs``); others as they are."""
    return key[:-len(".name")] if key.endswith(".name") and key.count(".") == 1 else key


@dataclass
class Comparison:
    """The runs (``labels``: the differing keys' values, or the folder), their identifying columns
    (``key_header``/``key_rows``: the differing keys, else the folder) and the metrics' values."""

    folders: list[str]
    key_header: list[str]
    key_rows: list[list]
    metrics: list[str]
    values: list[list]
    dropped: list[str]  # default metrics left out: n/a in every run

    def labels(self) -> list[str]:
        """``scheduler=fcfs workload.rate=2``; the folder first where the keys do not tell runs apart."""
        def pairs(header, row) -> str:
            return " ".join(f"{h}={_fmt(v)}" for h, v in zip(header, row))

        if self.key_header[:1] == ["run"]:
            return [row[0] + (f" ({pairs(self.key_header[1:], row[1:])})" if len(row) > 1 else "")
                    for row in self.key_rows]
        return [pairs(self.key_header, row) for row in self.key_rows]

    def runs_as_rows(self, folder: bool = False) -> tuple[list[str], list[list]]:
        """One row per run: its keys, then the metrics (``folder``: and its folder, last)."""
        header = [*self.key_header, *self.metrics] + (["folder"] if folder else [])
        rows = [[*k, *v] + ([f] if folder else []) for k, v, f in zip(self.key_rows, self.values, self.folders)]
        return header, rows

    def metrics_as_rows(self, stacked: bool = False) -> tuple[list[str], list[list]]:
        """One row per metric, one column per run headed by its label; ``stacked`` (a terminal's
        narrow columns): the keys one per line in the first header cell, each run's values on the
        same lines in its own."""
        rows = [[m, *(v[i] for v in self.values)] for i, m in enumerate(self.metrics)]
        if stacked:
            return (["\n".join(self.key_header), *("\n".join(map(_fmt, k)) for k in self.key_rows)], rows)
        return ["metric", *self.labels()], rows

    def layout(self, choice: str = "auto", stacked: bool = False) -> tuple[list[str], list[list]]:
        metrics_down = choice == "metrics" or (
            choice == "auto" and len(self.metrics) > MANY_METRICS and len(self.folders) <= len(self.metrics))
        return self.metrics_as_rows(stacked) if metrics_down else self.runs_as_rows()


def compare_runs(runs: list[dict], metrics: list[str], drop_empty: bool = False) -> Comparison:
    """The comparison of ``runs`` on ``metrics`` (``drop_empty``: leave out a metric n/a in every run)."""
    unknown = [m for m in metrics if all(m not in r["summary"] for r in runs)]
    if unknown:
        raise CompareError(f"--metrics: {unknown} in no run's summary.json (keys: docs/metrics.md; "
                           "'.' reaches into objects, e.g. ttft_ms.p99)")
    dropped = [m for m in metrics if drop_empty and all(r["summary"].get(m) is None for r in runs)]
    metrics = [m for m in metrics if m not in dropped]
    keys = label_keys(runs, differing_keys(runs))
    key_rows = [[r["config"].get(k) for k in keys] for r in runs]
    folders = [r["path"].name for r in runs]
    key_header = [short_key(k) for k in keys]
    if not keys or len({json.dumps(k, sort_keys=True) for k in key_rows}) < len(runs):
        # nothing (or not enough: repeats of one config) differs: the folder tells the runs apart
        key_header = ["run", *key_header]
        key_rows = [[f, *k] for f, k in zip(folders, key_rows)]
    values = [[r["summary"].get(m) for m in metrics] for r in runs]
    return Comparison(folders, key_header, key_rows, metrics, values, dropped)


def comparison(runs: list[dict], metrics: list[str]) -> tuple[list[str], list[list]]:
    """Header and rows, one row per run: the differing keys (or the folder), then the metrics
    (None where absent)."""
    return compare_runs(runs, metrics).runs_as_rows()


def _fmt(v) -> str:
    if v is None:
        return "n/a"
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, float):
        return f"{v:.4g}" if abs(v) < 1e4 else f"{v:,.0f}"
    return str(v)


def to_markdown(header: list[str], rows: list[list]) -> str:
    def cell(v) -> str:
        return (v if isinstance(v, str) else _fmt(v)).replace("|", "\\|")

    lines = ["| " + " | ".join(map(cell, header)) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def to_csv(header: list[str], rows: list[list]) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(header)
    writer.writerows([["" if v is None else v for v in row] for row in rows])
    return buf.getvalue()


def write_table(header: list[str], rows: list[list], out: Path) -> None:
    """``out``'s suffix decides: ``.csv`` or ``.md``."""
    if out.suffix not in (".csv", ".md"):
        raise CompareError(f"--out {out}: the file must end in .csv or .md")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(to_csv(header, rows) if out.suffix == ".csv" else to_markdown(header, rows))


def print_table(header: list[str], rows: list[list], title: str = "", caption: str = "") -> None:
    table = Table(title=title or None, caption=caption or None, header_style="bold")
    for i, h in enumerate(header):  # the first column (a metric's or a key's name) never wraps
        table.add_column(h, justify="left" if i == 0 else "right", overflow="fold", no_wrap=i == 0)
    for row in rows:
        table.add_row(*(v if isinstance(v, str) else _fmt(v) for v in row))
    Console().print(table)


def plot(runs: list[dict], metric: str, x: str, out: Path) -> Path:
    """``metric`` against config key ``x``; one line per combination of the other differing keys."""
    import matplotlib  # noqa: PLC0415 - matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415 - matplotlib

    if all(x not in r["config"] for r in runs):
        raise CompareError(f"--x {x}: not a config key of these runs (swept keys: {differing_keys(runs)})")
    others = [k for k in differing_keys(runs) if k != x]
    lines: dict[str, list[tuple]] = {}
    for r in runs:
        label = ", ".join(f"{k}={r['config'].get(k)}" for k in others) or metric
        value = r["summary"].get(metric)
        if value is not None:
            lines.setdefault(label, []).append((r["config"].get(x), value))
    fig, ax = plt.subplots(figsize=(6, 4))
    numeric = all(isinstance(v, (int, float)) for pts in lines.values() for v, _ in pts)
    for label, pts in lines.items():
        pts.sort(key=lambda p: p[0] if numeric else str(p[0]))
        xs = [p[0] if numeric else str(p[0]) for p in pts]
        ax.plot(xs, [p[1] for p in pts], marker="o", label=label)
    ax.set_xlabel(x)
    ax.set_ylabel(metric)
    ax.grid(alpha=0.3)
    if len(lines) > 1:
        ax.legend(fontsize=7)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="servelab compare", description=__doc__.split("\n\n", 1)[-1],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("paths", nargs="+", help="run folders, or folders of runs (a multirun)")
    p.add_argument("--metrics", help=f"comma-separated summary keys (default: {','.join(DEFAULT_METRICS)})")
    p.add_argument("--format", choices=FORMATS, default=None,
                   help="what to print: table on a terminal, markdown when piped (default), or csv")
    p.add_argument("--layout", choices=LAYOUTS, default="auto",
                   help=f"one row per run or per metric (auto: per metric when more than {MANY_METRICS} metrics "
                        "and no more runs than metrics)")
    p.add_argument("--out", type=Path, help="also write the table to this .csv or .md file")
    p.add_argument("--plot", metavar="METRIC", help="plot this metric against --x")
    p.add_argument("--x", metavar="KEY", help="the swept config key for --plot (default: the only differing key)")
    p.add_argument("--plot-out", type=Path, help="PNG path (default: <first folder>/compare_<metric>.png)")
    args = p.parse_args(argv)
    runs = [load_run(r) for r in find_runs(args.paths)]
    if args.metrics:
        metrics = [m.strip() for m in args.metrics.split(",") if m.strip()]
    else:  # the defaults some run has (older runs lack newer keys)
        metrics = [m for m in DEFAULT_METRICS if any(m in r["summary"] for r in runs)]
    table = compare_runs(runs, metrics, drop_empty=not args.metrics)  # a metric asked for by name stays
    fmt = args.format or ("table" if sys.stdout.isatty() else "markdown")
    note = f"n/a in every run: {', '.join(table.dropped)}" if table.dropped else ""
    if fmt == "csv":
        sys.stdout.write(to_csv(*table.runs_as_rows(folder=True)))
    elif fmt == "markdown":
        sys.stdout.write(to_markdown(*table.layout(args.layout)) + (f"\n{note}\n" if note else ""))
    else:
        print_table(*table.layout(args.layout, stacked=True), title=f"{len(runs)} runs", caption=note)
    sys.stdout.flush()
    if args.out:
        write_table(*(table.runs_as_rows(folder=True) if args.out.suffix == ".csv" else table.layout(args.layout)),
                    args.out)
        print(f"table: {args.out}", file=sys.stderr if fmt != "table" else sys.stdout, flush=True)
    if args.plot:
        keys = differing_keys(runs)
        x = args.x or (keys[0] if len(keys) == 1 else None)
        if x is None:
            raise CompareError(f"--plot needs --x: the runs differ in {keys or 'nothing'}")
        out = args.plot_out or Path(args.paths[0]) / f"compare_{args.plot.replace('.', '_')}.png"
        print(f"plot: {plot(runs, args.plot, x, out)}", file=sys.stderr if fmt != "table" else sys.stdout,
              flush=True)
    return 0
