"""``servelab grade <kind>=<name> [...] [--out FILE] [hydra.run.dir=DIR]``: score a plugin against the built-ins.

Every fixed workload of :mod:`servelab.kit.grade_workloads` runs on the simulator's virtual clock
for the submission and for each built-in of its kind (the other plugins: the default stack).
Per workload and policy: output throughput, TTFT and TPOT p50/p99, SLO attainment,
preemptions, and the **score**: goodput (requests meeting both SLOs per second) relative to the
default stack's (fcfs, paged, recompute), ``None`` when that is 0; on a fairness workload
(``fairness_flood``: one client floods) the goodput of the client that behaves, so a fair-sharing
scheduler scores by what it protects. The overall score is the geometric mean over workloads. A
scheduler that orders by predicted output length (``scheduler=sjf``) is graded with the oracle
predictor (an upper bound). An evictor is graded on the workloads made for it (``prefix_thrash``:
shared prefixes through a prefix cache that thrashes) against ``lru`` in the same grade run: its
score is the geometric mean of its prefix-cache hit rate and its goodput, each relative to lru's
(throughput is set by the open-loop arrivals there, so it would not tell evictors apart). A router
is graded on a cluster (``cluster_chat``: 4 busy replicas, multi-turn chat sharing system prompts)
against ``round_robin`` and the other built-in routers: its score is the geometric mean of its goodput
relative to round_robin's and round_robin's TTFT p99 relative to its own (a lower tail scores higher);
the table shows the prefix-cache hit rate, what placing for cache hits buys. A migration policy is
graded on ``cluster_drift`` (heavy-tailed answers through 4 replicas with small KV pools, placed round
robin) against ``none`` by the router's rule: goodput and TTFT p99, each relative to none's. A KV tier policy is
graded on ``tier_chat`` (``prefix_thrash``'s traffic above a host tier and a disk) against
``write_back``: the geometric mean of its goodput relative to write_back's, write_back's TTFT mean and
prefill tokens computed relative to its own (what loading instead of computing buys; not the TTFT p99,
which storing nothing wins there); the table shows the tier hit rate. Drafters, time models and
length predictors are not graded: they change no simulated schedule worth scoring on their own (a
length predictor shows through ``scheduler=sjf``).
Deterministic: the same numbers on every machine and every run.
The tables go to ``hydra.run.dir`` as ``grade.md`` and ``grade.csv`` (``--out FILE`` names one file
instead; default ``outputs/grade/<date>/<time>/``).
"""

from __future__ import annotations

import argparse
import csv
import io
import math
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from servelab.core.errors import ServelabError
from servelab.core.kinds import KINDS
from servelab.core.registry import Registry, default_registry
from servelab.kit.grade_workloads import SIM, GradeWorkload, graded_kinds, workloads_for
from servelab.config import register_configs
from servelab.results.writable import writable_file, writable_folder
from servelab.run.runner import run_workload

# kind -> the built-in it is scored against (the kinds table's grade_reference; a router: round_robin)
GRADED = graded_kinds()
PREDICTOR = "length_predictor=oracle"  # what a scheduler that orders by predicted length is graded with


@dataclass(frozen=True)
class Term:
    """One factor of a score: the submission's figure against the reference's, oriented so above 1
    is better (``higher``: the figure's ratio, else its inverse)."""

    field: str  # a Row field
    label: str  # as a page writes it
    higher: bool = True
    about: str = ""  # what the figure is, for the pages (goodput's is stated once for every kind)

    def ratio(self, row: "Row", reference: "Row") -> float | None:
        mine, theirs = getattr(row, self.field), getattr(reference, self.field)
        if not mine or not theirs:
            return None
        return mine / theirs if self.higher else theirs / mine


GOODPUT = Term("goodput_req_s", "goodput")
HIT_RATE = Term("prefix_hit_rate", "prefix hit rate", about="prompt tokens served from the GPU prefix cache / prompt "
                "tokens")
TTFT_P99 = Term("ttft_p99_ms", "TTFT p99", higher=False)
TTFT_MEAN = Term("ttft_mean_ms", "TTFT mean", higher=False)
PREFILL = Term("prefill_tokens_computed", "prefill tokens computed", higher=False,
               about="prompt tokens computed, neither a GPU prefix hit nor loaded from a tier (`summary.json`'s "
                     "`prefill_tokens_computed`): storing nothing computes the most")


@dataclass(frozen=True)
class Column:
    """The table's last column but the score: what a kind changes that the other columns do not show."""

    header: str
    field: str  # a Row field
    percent: bool = False


JAIN = Column("Jain", "jain_fairness_index")
PREFIX_HIT = Column("prefix hit", "prefix_hit_rate", percent=True)
TIER_HIT = Column("tier hit", "tier_hit_rate", percent=True)


@dataclass(frozen=True)
class ScoreRule:
    """How a kind's rows are scored against its reference's on one workload: the geometric mean of
    ``terms``; ``column``: the figure the table shows before the score."""

    terms: tuple[Term, ...] = (GOODPUT,)
    column: Column = JAIN


#: kind -> its rule (a kind not listed: goodput alone). The pages' grade formulas are written from this.
#: A KV tier policy is scored on TTFT's mean, not its p99, and on the prefill it saves: on ``tier_chat``
#: storing nothing had the best TTFT p99 of all (4.79 s against write_back's 5.49 s; its median 1.85 s
#: against 0.74 s), so a p99 term paid a policy for storing less.
SCORE_RULES = {"evictor": ScoreRule((HIT_RATE, GOODPUT), PREFIX_HIT),
               "router": ScoreRule((GOODPUT, TTFT_P99), PREFIX_HIT),
               "migration_policy": ScoreRule((GOODPUT, TTFT_P99)),
               "kv_tier_policy": ScoreRule((GOODPUT, TTFT_MEAN, PREFILL), TIER_HIT)}


def score_rule(kind: str) -> ScoreRule:
    return SCORE_RULES.get(kind, ScoreRule())


@dataclass
class Row:
    """One policy on one workload."""

    workload: str
    policy: str
    finished: int
    requests: int
    throughput_tok_s: float
    ttft_p50_ms: float | None
    ttft_p99_ms: float | None
    tpot_p50_ms: float | None
    tpot_p99_ms: float | None
    slo_attainment: float | None
    preemptions: int
    goodput_req_s: float  # of the scored clients' requests (GradeWorkload.scored_clients), else of all
    jain_fairness_index: float | None = None
    max_service_gap_tokens: float | None = None
    score: float | None = None  # goodput / the reference's (an evictor's: see score_of)
    prefix_hit_rate: float = 0.0  # prompt tokens served from the prefix cache / prompt tokens
    ttft_mean_ms: float | None = None
    prefill_tokens_computed: int = 0  # prompt tokens computed (not a GPU prefix hit, not loaded from a tier)
    tier_hit_rate: float = 0.0  # prompt blocks the GPU cache missed that a KV tier loaded (0: no tiers)


@dataclass
class Grade:
    """A submission's rows (its own first in each workload) and its overall score."""

    kind: str
    name: str
    rows: list[Row]

    @property
    def score(self) -> float | None:
        """Geometric mean of the submission's per-workload scores (None if any is undefined or 0)."""
        own = [r.score for r in self.rows if r.policy == self.name]
        scores = [s for s in own if not (s is None or s <= 0)]
        if not own or len(scores) < len(own):
            return None
        return math.exp(sum(math.log(s) for s in scores) / len(scores))


def grade(kind: str, name: str, registry: Registry | None = None,
          workloads: tuple[GradeWorkload, ...] | None = None) -> Grade:
    """Run ``kind=name`` and every built-in of that kind on ``workloads`` (default: those that
    grade ``kind``); ``registry``: one holding the plugin (default: the installed entry points)."""
    if kind not in GRADED:
        raise ServelabError(f"grade: kind {kind!r} cannot be graded; kinds: {', '.join(GRADED)} (drafters, time "
                            "models and length predictors change no simulated schedule worth scoring: docs/plugins.md)")
    workloads = workloads_for(kind) if workloads is None else workloads
    registry = registry or default_registry()
    registry.get(kind, name)  # an unknown name fails here, listing the known ones
    register_configs(registry)
    builtins = [n for n in registry.names(kind) if registry.get(kind, n).__module__.startswith("servelab.plugins.")]
    policies = [name, *(n for n in builtins if n != name)]
    rows = []
    for workload in workloads:
        requests = workload.requests()
        results = {p: _run(kind, p, workload, requests, registry) for p in policies}
        for row in results.values():
            row.score = score_of(kind, row, results.get(GRADED[kind]))
            rows.append(row)
    return Grade(kind, name, rows)


def score_of(kind: str, row: Row, reference: Row | None) -> float | None:
    """``row``'s score against ``reference`` (:func:`score_rule`: the geometric mean of its terms,
    goodput relative to the reference's, for an evictor also the prefix-cache hit rate, for a router
    the reference's TTFT p99 relative to its own, for a KV tier policy the reference's TTFT mean and
    prefill tokens computed relative to its own). None when the reference is
    missing or a term's figure is 0 or missing."""
    if reference is None:
        return None
    ratios = [term.ratio(row, reference) for term in score_rule(kind).terms]
    known = [r for r in ratios if r is not None]
    if len(known) < len(ratios):
        return None
    return math.prod(known) ** (1.0 / len(known))


def _run(kind: str, policy: str, workload: GradeWorkload, requests, registry: Registry) -> Row:
    from servelab.api import compose  # noqa: PLC0415 - torch
    from servelab.run.session import collect_results  # noqa: PLC0415 - torch
    from servelab.assemble.stack import build_stack  # noqa: PLC0415 - torch

    overrides = [*SIM, *workload.overrides, f"{kind}={policy}"]
    if kind == "scheduler" and registry.get(kind, policy).needs_length_predictor:
        overrides.append(PREDICTOR)
    cfg = compose(overrides, logger="none", progress=False)
    if KINDS[kind].scope == "cluster":
        results = _run_cluster(cfg, requests, registry)
    else:
        stack = build_stack(cfg, registry)
        try:
            run_workload(stack.engine, requests)
            results = collect_results(stack.engine, 1.0)
        finally:
            stack.executor.shutdown()
    s = results.summary
    goodput = s["goodput_req_s"] or 0.0
    if workload.scored_clients is not None:
        met = sum(1 for r in results.requests if r["client_id"] in workload.scored_clients and r["met_slo"])
        goodput = met / s["duration_s"] if s["duration_s"] else 0.0
    return Row(workload.name, policy, s["num_finished"], s["num_requests"], s["output_throughput_tok_s"],
               s["ttft_ms"]["p50"], s["ttft_ms"]["p99"], s["tpot_ms"]["p50"], s["tpot_ms"]["p99"],
               s["slo_attainment"], s["num_preemptions"], goodput, s.get("jain_fairness_index"),
               s.get("max_service_gap_tokens"), prefix_hit_rate=s["prefix_cache_hit_rate"],
               ttft_mean_ms=s["ttft_ms"]["mean"], prefill_tokens_computed=s.get("prefill_tokens_computed") or 0,
               tier_hit_rate=s.get("kv_tier_hit_rate") or 0.0)


def _run_cluster(cfg, requests, registry: Registry):
    """``requests`` through the cluster ``cfg`` describes, its plugins (the router too) from
    ``registry``; the result files go to a folder removed afterwards."""
    from servelab.run.cluster_run import run_cluster_job  # noqa: PLC0415 - torch

    with tempfile.TemporaryDirectory(prefix="servelab-grade-") as folder:
        return run_cluster_job(cfg, Path(folder), requests, registry=registry)


# ---- output ---------------------------------------------------------------------------------
HEADER = ("workload", "policy", "finished", "tok/s", "TTFT p50 ms", "TTFT p99 ms", "TPOT p50 ms", "TPOT p99 ms",
          "SLO met", "preemptions")


def header(kind: str) -> tuple[str, ...]:
    return (*HEADER, score_rule(kind).column.header, "score")


def _cells(row: Row, kind: str = "scheduler") -> tuple[str, ...]:
    def num(v, fmt="{:.1f}"):
        return "-" if v is None else fmt.format(v)

    column = score_rule(kind).column
    figure = getattr(row, column.field)
    last = num(None if figure is None else 100 * figure, "{:.1f}%") if column.percent else num(figure, "{:.3f}")
    return (row.workload, row.policy, f"{row.finished}/{row.requests}", num(row.throughput_tok_s, "{:.0f}"),
            num(row.ttft_p50_ms), num(row.ttft_p99_ms), num(row.tpot_p50_ms), num(row.tpot_p99_ms),
            num(None if row.slo_attainment is None else 100 * row.slo_attainment, "{:.1f}%"),
            str(row.preemptions), last, num(row.score, "{:.3f}"))


def title(g: Grade) -> str:
    overall = "-" if g.score is None else f"{g.score:.3f}"
    measure = " and ".join(term.label for term in score_rule(g.kind).terms)
    workloads = list(dict.fromkeys(r.workload for r in g.rows))
    over = f"geometric mean over {len(workloads)} workloads" if len(workloads) != 1 else f"on {workloads[0]}"
    return (f"{g.kind}={g.name}: score {overall} ({measure} vs {GRADED[g.kind]}, {over}; "
            f"simulated {SIM[1][6:]} on {SIM[2][9:]})")


def print_grade(g: Grade) -> None:
    table = Table(title=title(g), title_justify="left")
    for i, head in enumerate(header(g.kind)):
        table.add_column(head, justify="left" if i < 2 else "right")
    for row in g.rows:
        table.add_row(*_cells(row, g.kind), style="bold" if row.policy == g.name else None,
                      end_section=row is g.rows[-1] or row.workload != g.rows[g.rows.index(row) + 1].workload)
    Console(width=160).print(table)


def to_markdown(grades: list[Grade]) -> str:
    parts = []
    for g in grades:
        head = header(g.kind)
        lines = [f"## {title(g)}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        lines += ["| " + " | ".join(_cells(r, g.kind)) + " |" for r in g.rows]
        parts.append("\n".join(lines) + "\n")
    return "\n".join(parts)


def to_csv(grades: list[Grade]) -> str:
    buf = io.StringIO()
    fields = ["kind", "submission", *asdict(grades[0].rows[0])] if grades and grades[0].rows else ["kind"]
    writer = csv.DictWriter(buf, fieldnames=fields, lineterminator="\n")
    writer.writeheader()
    for g in grades:
        for r in g.rows:
            # rounded: the last bits of a float may differ between platforms' libm
            writer.writerow({"kind": g.kind, "submission": g.name,
                             **{k: round(v, 4) if isinstance(v, float) else v for k, v in asdict(r).items()}})
    return buf.getvalue()


def main(argv: list[str]) -> int:
    """``servelab grade <kind>=<name> [<kind>=<name> ...] [--out FILE.md|FILE.csv] [hydra.run.dir=DIR]``."""
    parser = argparse.ArgumentParser(prog="servelab grade",
                                     description="Score plugins against the built-ins on fixed simulated workloads.")
    parser.add_argument("plugins", nargs="+", help=f"<kind>=<name>, kind one of {', '.join(GRADED)}; "
                        "hydra.run.dir=DIR: write grade.md and grade.csv there")
    parser.add_argument("--out", help="write the tables to this file instead: FILE.csv as CSV, any other name as "
                        "Markdown (default: grade.md and grade.csv in hydra.run.dir, outputs/grade/<date>/<time>)")
    args = parser.parse_args(argv)
    run_dir, specs = _run_dir(args.plugins)
    if not specs:
        raise ServelabError(f"expected <kind>=<name> with kind one of {', '.join(GRADED)}")
    from servelab.api import command_output_dir  # noqa: PLC0415 - torch

    # where the tables go, checked before the grading (minutes) rather than after it
    if args.out and not run_dir:
        writable_file(args.out, f"--out {args.out}")
    else:
        folder = writable_folder(command_output_dir("grade", run_dir), f"hydra.run.dir={run_dir}" if run_dir
                                 else "the grade folder")
    grades = []
    for spec in specs:
        kind, sep, name = spec.partition("=")
        if not sep or not name:
            raise ServelabError(f"expected <kind>=<name> with kind one of {', '.join(GRADED)}, got {spec!r}")
        grades.append(grade(kind, name))
        print_grade(grades[-1])
    if args.out and not run_dir:
        out = Path(args.out)
        out.write_text(to_csv(grades) if out.suffix.lower() == ".csv" else to_markdown(grades))
        print(f"results: {out}")
        return 0
    (folder / "grade.md").write_text(to_markdown(grades))
    (folder / "grade.csv").write_text(to_csv(grades))
    print(f"results: {folder}/grade.md, grade.csv")
    return 0


def _run_dir(args: list[str]) -> tuple[str | None, list[str]]:
    """``hydra.*`` overrides among the arguments (``hydra.run.dir=DIR``): the run folder they set,
    resolved as ``run.py`` would; and the other arguments (the plugins)."""
    hydra_args = [a for a in args if a.lstrip("+~").startswith("hydra.")]
    if not hydra_args:
        return None, args
    from hydra.errors import HydraException  # noqa: PLC0415

    from servelab.api import compose_with_run_dir  # noqa: PLC0415 - torch

    try:
        _, run_dir = compose_with_run_dir(hydra_args)
    except HydraException as exc:
        raise ServelabError(str(exc).splitlines()[0]) from None
    return run_dir, [a for a in args if a not in hydra_args]
