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

Every job folder is a run, whatever became of it: its ``status`` is ``summary.json``'s (``completed``,
``interrupted``, ``partial``, ``failed: ...``), else ``failed: <error.txt>`` or ``no summary.json``
(the config then from ``.hydra/``). When some run did not complete, the table gets a ``status`` column
(or row) and a run's label its mark (``[interrupted]``), and a footer counts them and says why
(``3 runs: 2 completed, 1 failed (2_block_size=16: failed: ...)``; on stderr with CSV, whose
``status`` column is always there). ``--completed-only`` compares only the completed runs and exits 1,
naming the others, when some did not complete. Runs from several paths whose folder names collide are
named with the parent folders that tell them apart (``sweepA/0_block_size=24``); the CSV's ``folder``
is the path as given.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from servelab.cli.compare_runs import (COMPLETED, NO_SUMMARY, CompareError, completed_only, find_runs, load_run,
                                       run_names, status_kind)
from servelab.results.writable import writable_file

DEFAULT_METRICS = ("num_finished", "num_rejected", "output_throughput_tok_s", "ttft_ms.p50", "ttft_ms.p99",
                   "tpot_ms.p50", "slo_attainment", "goodput_req_s", "num_preemptions", "prefix_cache_hit_rate",
                   "leaked_blocks")
# differ between every run yet say nothing about what was compared
_NOISE = ("hydra", "logger", "progress", "eval_ppl")
MANY_METRICS = 6  # more metrics than this (and no more runs than metrics): one row per metric
FORMATS = ("table", "markdown", "csv")
LAYOUTS = ("auto", "runs", "metrics")


def differing_keys(runs: list[dict]) -> list[str]:
    """Config keys whose values are not the same in every run (in config order). A run without a
    config (a job folder with neither ``config.yaml`` nor ``.hydra/``) takes no part."""
    runs = [r for r in runs if r["config"]] or runs
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
    (``key_header``/``key_rows``: the differing keys, else the folder), the metrics' values and each
    run's status. ``names``: the folders as short as tells them apart; ``folders``: as given."""

    folders: list[str]
    key_header: list[str]
    key_rows: list[list]
    metrics: list[str]
    values: list[list]
    dropped: list[str]  # default metrics left out: n/a in every run
    statuses: list[str]
    names: list[str]

    def incomplete(self) -> bool:
        """Whether some run did not complete (then a status column or row is shown, and a footer)."""
        return any(s != COMPLETED for s in self.statuses)

    def marks(self) -> list[str]:
        """`` [interrupted]``, `` [failed]``, ... after a run that did not complete; "" after one that did."""
        return ["" if s == COMPLETED else f" [{status_kind(s)}]" for s in self.statuses]

    def labels(self) -> list[str]:
        """``scheduler=fcfs workload.rate=2``; the folder first where the keys do not tell runs apart;
        `` [interrupted]`` (the status's first word) after a run that did not complete."""
        def pairs(header, row) -> str:
            return " ".join(f"{h}={_fmt(v)}" for h, v in zip(header, row))

        if self.key_header[:1] == ["run"]:
            labels = [row[0] + (f" ({pairs(self.key_header[1:], row[1:])})" if len(row) > 1 else "")
                      for row in self.key_rows]
        else:
            labels = [pairs(self.key_header, row) for row in self.key_rows]
        return [label + mark for label, mark in zip(labels, self.marks())]

    def status_cells(self, brief: bool = False) -> list[str]:
        """Each run's status (``brief``: its first word, the footer saying why)."""
        return list(map(status_kind, self.statuses)) if brief else self.statuses

    def runs_as_rows(self, folder: bool = False, status: bool | None = None,
                     brief: bool = False) -> tuple[list[str], list[list]]:
        """One row per run: its keys, then the metrics, then its status (``status``: always; None: when
        some run did not complete; ``brief``: its first word), then (``folder``) its folder as given."""
        status = self.incomplete() if status is None else status
        header = [*self.key_header, *self.metrics] + (["status"] if status else []) + (["folder"] if folder else [])
        rows = [[*k, *v] + ([s] if status else []) + ([f] if folder else [])
                for k, v, s, f in zip(self.key_rows, self.values, self.status_cells(brief), self.folders)]
        return header, rows

    def metrics_as_rows(self, stacked: bool = False) -> tuple[list[str], list[list]]:
        """One row per metric, one column per run headed by its label (and a last ``status`` row when
        some run did not complete); ``stacked`` (a terminal's narrow columns): the keys one per line in
        the first header cell, each run's values (and its mark) on the same lines in its own, and
        the status row its first word (the footer says why)."""
        rows = [[m, *(v[i] for v in self.values)] for i, m in enumerate(self.metrics)]
        if self.incomplete():
            rows.append(["status", *self.status_cells(brief=stacked)])
        if stacked:
            cells = ["\n".join(map(_fmt, k)) + mark.replace(" ", "\n", 1)
                     for k, mark in zip(self.key_rows, self.marks())]
            return ["\n".join(self.key_header), *cells], rows
        return ["metric", *self.labels()], rows

    def layout(self, choice: str = "auto", stacked: bool = False) -> tuple[list[str], list[list]]:
        """One row per run or per metric (``choice``); ``stacked``: for a terminal (see :meth:`metrics_as_rows`)."""
        metrics_down = choice == "metrics" or (
            choice == "auto" and len(self.metrics) > MANY_METRICS and len(self.folders) <= len(self.metrics))
        return self.metrics_as_rows(stacked) if metrics_down else self.runs_as_rows(brief=stacked)

    def footer(self) -> str:
        """``3 runs: 2 completed, 1 failed (2_block_size=16: failed: ...)``: the runs counted by status,
        then each one that did not complete and why; "" when every run completed."""
        if not self.incomplete():
            return ""
        counts = Counter([COMPLETED, *map(status_kind, self.statuses)])
        counts[COMPLETED] -= 1  # listed first, 0 or not
        said = ", ".join(f"{n} {'without summary.json' if kind == NO_SUMMARY else kind}" for kind, n in counts.items())
        why = "; ".join(f"{name}: {s}" for name, s in zip(self.names, self.statuses) if s != COMPLETED)
        return f"{len(self.statuses)} runs: {said} ({why})"


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
    names = run_names([r["path"] for r in runs])
    key_header = [short_key(k) for k in keys]
    if not keys or len({json.dumps(k, sort_keys=True) for k in key_rows}) < len(runs):
        # nothing (or not enough: repeats of one config) differs: the folder tells the runs apart
        key_header = ["run", *key_header]
        key_rows = [[n, *k] for n, k in zip(names, key_rows)]
    values = [[r["summary"].get(m) for m in metrics] for r in runs]
    return Comparison([str(r["path"]) for r in runs], key_header, key_rows, metrics, values, dropped,
                      [r.get("status", COMPLETED) for r in runs], names)


def comparison(runs: list[dict], metrics: list[str]) -> tuple[list[str], list[list]]:
    """Header and rows, one row per run: the differing keys (or the folder), then the metrics
    (None where absent), then the status when some run did not complete."""
    return compare_runs(runs, metrics).runs_as_rows()


def _fmt(v) -> str:
    """A cell of the table or Markdown: ``n/a`` for None; numbers from 10,000 up with thousands
    separators, ints and floats alike (``12,345``); smaller floats to 4 significant digits."""
    if v is None:
        return "n/a"
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, int):
        return f"{v:,}" if abs(v) >= 10_000 else str(v)
    if isinstance(v, float):  # below 9,999.5 so that 4 digits never round up to 1e+04
        return f"{v:.4g}" if abs(v) < 9_999.5 else f"{v:,.0f}"
    return str(v)


def to_markdown(header: list[str], rows: list[list], footer: str = "") -> str:
    """A Markdown table (``footer``: a line under it, after a blank one)."""
    def cell(v) -> str:
        return (v if isinstance(v, str) else _fmt(v)).replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(map(cell, header)) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines) + "\n" + (f"\n{footer}\n" if footer else "")


def to_csv(header: list[str], rows: list[list]) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(header)
    writer.writerows([["" if v is None else v for v in row] for row in rows])
    return buf.getvalue()


def write_table(header: list[str], rows: list[list], out: Path, footer: str = "") -> None:
    """``out``'s suffix decides: ``.csv`` or ``.md`` (with ``footer`` under the table)."""
    if out.suffix not in (".csv", ".md"):
        raise CompareError(f"--out {out}: the file must end in .csv or .md")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(to_csv(header, rows) if out.suffix == ".csv" else to_markdown(header, rows, footer))


def print_table(header: list[str], rows: list[list], title: str = "", caption: str = "", footer: str = "") -> None:
    """A rich table on the terminal (text shown as it is: ``[failed]`` is no markup), ``footer`` under it."""
    table = Table(title=escape(title) or None, caption=escape(caption) or None, header_style="bold")
    for i, h in enumerate(header):  # the first column (a metric's or a key's name) never wraps
        table.add_column(escape(h), justify="left" if i == 0 else "right", overflow="fold", no_wrap=i == 0)
    for row in rows:
        table.add_row(*(escape(v if isinstance(v, str) else _fmt(v)) for v in row))
    console = Console()
    console.print(table)
    if footer:
        console.print(escape(footer), style="yellow", soft_wrap=True)


def plot_points(runs: list[dict], metric: str, x: str) -> dict[str, list[tuple]]:
    """``{line label: [(x value, metric value, mark)]}``: one line per combination of the differing
    keys other than ``x``; ``mark`` is "" for a completed run, else its status's first word."""
    others = [k for k in differing_keys(runs) if k != x]
    lines: dict[str, list[tuple]] = {}
    for r in runs:
        label = ", ".join(f"{k}={r['config'].get(k)}" for k in others) or metric
        value = r["summary"].get(metric)
        status = r.get("status", COMPLETED)
        if value is not None:
            lines.setdefault(label, []).append((r["config"].get(x), value, "" if status == COMPLETED
                                                else status_kind(status)))
    return lines


def plot(runs: list[dict], metric: str, x: str, out: Path) -> Path:
    """``metric`` against config key ``x``; one line per combination of the other differing keys; a
    run that did not complete is a hollow point labelled with its status (``interrupted``)."""
    import matplotlib  # noqa: PLC0415 - matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415 - matplotlib

    if all(x not in r["config"] for r in runs):
        raise CompareError(f"--x {x}: not a config key of these runs (swept keys: {differing_keys(runs)})")
    lines = plot_points(runs, metric, x)
    fig, ax = plt.subplots(figsize=(6, 4))
    numeric = all(isinstance(v, (int, float)) for pts in lines.values() for v, _, _ in pts)
    for label, pts in lines.items():
        pts.sort(key=lambda p: p[0] if numeric else str(p[0]))
        xs = [p[0] if numeric else str(p[0]) for p in pts]
        (line,) = ax.plot(xs, [p[1] for p in pts], marker="o", label=label)
        for px, (_, y, mark) in zip(xs, pts):
            if mark:
                ax.plot([px], [y], marker="o", markerfacecolor="white", color=line.get_color())
                ax.annotate(mark, (px, y), textcoords="offset points", xytext=(4, 4), fontsize=7)
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
    p.add_argument("--completed-only", action="store_true",
                   help="compare only the runs that completed; exit 1, naming the others, when some did not")
    args = p.parse_args(argv)
    if args.out:  # checked before anything is printed: the table is not worth printing half of
        if args.out.suffix not in (".csv", ".md"):
            raise CompareError(f"--out {args.out}: the file must end in .csv or .md")
        writable_file(args.out, f"--out {args.out}")
    if args.plot_out:
        writable_file(args.plot_out, f"--plot-out {args.plot_out}")
    runs = [load_run(r) for r in find_runs(args.paths)]
    left_out = ""
    if args.completed_only:
        runs, left_out = completed_only(runs)
        if not runs:
            print(left_out, file=sys.stderr, flush=True)
            return 1
    if args.metrics:
        metrics = [m.strip() for m in args.metrics.split(",") if m.strip()]
    else:  # the defaults some run has (older runs lack newer keys)
        metrics = [m for m in DEFAULT_METRICS if any(m in r["summary"] for r in runs)]
    table = compare_runs(runs, metrics, drop_empty=not args.metrics)  # a metric asked for by name stays
    fmt = args.format or ("table" if sys.stdout.isatty() else "markdown")
    note = f"n/a in every run: {', '.join(table.dropped)}" if table.dropped else ""
    footer = table.footer()
    if fmt == "csv":  # the footer to stderr: the CSV stays parseable
        sys.stdout.write(to_csv(*table.runs_as_rows(folder=True, status=True)))
        if footer:
            print(footer, file=sys.stderr)
    elif fmt == "markdown":
        sys.stdout.write(to_markdown(*table.layout(args.layout), "\n".join(filter(None, (note, footer)))))
    else:
        print_table(*table.layout(args.layout, stacked=True), title=f"{len(runs)} runs", caption=note, footer=footer)
    sys.stdout.flush()
    if args.out:
        csv_out = args.out.suffix == ".csv"
        write_table(*(table.runs_as_rows(folder=True, status=True) if csv_out else table.layout(args.layout)),
                    args.out, footer)
        print(f"table: {args.out}", file=sys.stderr if fmt != "table" else sys.stdout, flush=True)
    if args.plot:
        keys = differing_keys(runs)
        x = args.x or (keys[0] if len(keys) == 1 else None)
        if x is None:
            raise CompareError(f"--plot needs --x: the runs differ in {keys or 'nothing'}")
        out = args.plot_out or Path(args.paths[0]) / f"compare_{args.plot.replace('.', '_')}.png"
        print(f"plot: {plot(runs, args.plot, x, out)}", file=sys.stderr if fmt != "table" else sys.stdout,
              flush=True)
    if left_out:
        print(left_out, file=sys.stderr, flush=True)
        return 1
    return 0
