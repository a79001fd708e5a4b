"""The page's figures, one per metric, a line (or bar) per run; each drawn only where some run has the data.

Every function takes the runs (labelled, :class:`~servelab.results.page.runs.RunData`) and a folder,
writes one PNG there and returns a :class:`Figure` (its file, title and what a reader should know to
read it), or None when no run has what it draws. Over-time figures bin each replica's steps
(:mod:`servelab.engine.timeline`) into up to :data:`BINS` slices of the run: means per slice (a slice
no step ran through is a gap: the engine was idle), and a cluster's replicas summed (the KV share:
their mean). Colours follow the run (or, in a replica figure, the replica) through every figure.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from servelab.results.page.runs import RunData

BINS = 200
SIZE = (7.5, 3.6)
DPI = 110
NAMES = {"ttft_ms": "TTFT", "tpot_ms": "TPOT", "e2e_ms": "end-to-end latency"}
DOTS = {"marker": ".", "markersize": 2.5}  # a busy slice between two idle ones is a point, which a line omits


@dataclass
class Figure:
    """A PNG the page shows: ``file`` (its name in the figures folder), a title and a caption."""

    file: str
    title: str
    caption: str


def _pyplot():
    import matplotlib  # noqa: PLC0415 - matplotlib loads only when a page is drawn

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415 - as above

    return plt


def _colour(i: int) -> str:
    return f"C{i % 10}"


def _save(fig, ax, out: Path, name: str, legend: bool) -> str:
    if legend:
        ax.legend(fontsize=8, loc="best")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / name, dpi=DPI)
    _pyplot().close(fig)
    return name


def _ms(v: float) -> str:
    return f"{v:,.0f} ms" if v >= 100 else f"{v:.3g} ms"


# ---- latency ----------------------------------------------------------------------------------
def latency_cdf(runs: list[RunData], latency: str, out: Path) -> Figure | None:
    """The share of requests whose ``latency`` is at most x, a line per run, the SLO targets dashed."""
    drawn = [(i, r, np.sort(r.latencies.get(latency, np.array([])))) for i, r in enumerate(runs)]
    drawn = [(i, r, v) for i, r, v in drawn if len(v)]
    if not drawn:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=SIZE)
    for i, r, v in drawn:
        share = np.arange(1, len(v) + 1) / len(v)
        ax.step(v, share, where="post", color=_colour(i),
                label=f"{r.label}: p50 {_ms(float(np.percentile(v, 50)))}, p99 {_ms(float(np.percentile(v, 99)))}")
    targets: dict[float, list[str]] = {}
    for _, r, _ in drawn:
        for name, value in r.slo_targets(latency).items():
            targets.setdefault(value, []).append(name)
    for k, (value, names) in enumerate(sorted(targets.items())):
        ax.axvline(value, color="0.25", linestyle=("--", ":", "-.")[k % 3], linewidth=1.2,
                   label=f"{'/'.join(sorted(set(names)))}: {_ms(value)}")
    lo = min(float(v[0]) for _, _, v in drawn)
    hi = max([float(v[-1]) for _, _, v in drawn] + list(targets))
    if lo > 0 and hi / lo >= 50:
        from matplotlib.ticker import FuncFormatter  # noqa: PLC0415 - matplotlib, as in _pyplot

        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,g}"))  # 10, 100, 1,000 (not 10^n)
    ax.set_xlabel(f"{NAMES[latency]} (ms{', log scale' if ax.get_xscale() == 'log' else ''})")
    ax.set_ylabel("share of requests")
    ax.set_ylim(0, 1.02)
    ax.set_title(f"{NAMES[latency]}: cumulative distribution")
    name = _save(fig, ax, out, f"{latency.removesuffix('_ms')}_cdf.png", True)
    met = [f"{r.label}: {a:.0%}" for _, r, _ in drawn
           if (a := r.summary.get(f"{latency.removesuffix('_ms')}_slo_attainment")) is not None]
    caption = (f"Share of requests (y) whose {NAMES[latency]} is at most x, over the requests that have one. "
               + ("Grey lines: the SLO targets; attainment " + ", ".join(met) + "." if targets and met
                  else "Grey lines: the SLO targets." if targets
                  else "No SLO target was set (slo.* or workload.slo_classes)."))
    return Figure(name, f"{NAMES[latency]} distribution", caption)


# ---- over time --------------------------------------------------------------------------------
SERIES = {  # column -> (title, y label, how replicas combine, caption)
    "running": ("Requests running", "requests in the step", "sum",
                "Requests in each step (batch size), mean per time slice."),
    "waiting": ("Requests waiting", "requests held, not in the step", "sum",
                "Requests the scheduler held but did not run in the step (queued, swapped out, a prompt "
                "left for the next step), mean per time slice: a queue building up shows here."),
    "kv_used": ("KV cache used", "KV blocks used (%)", "mean",
                "The share of the KV pool's blocks in use after each step, mean per time slice."),
    "tokens": ("Tokens per step", "tokens computed per step", "sum",
               "Tokens computed per step (prompt chunks and decodes), mean per time slice; a batch shrinking "
               "under preemption shows as a dip."),
}


def _edges(runs: list[RunData]) -> np.ndarray | None:
    """Slices of the longest run: :data:`BINS`, fewer where a replica kept fewer than 4 steps a slice
    (a slow real engine's few steps would leave most slices empty)."""
    kept = [t for r in runs for t in r.timelines if len(t.get("time_s", ()))]
    end = max((float(t["time_s"][-1]) for t in kept), default=0.0)
    if end <= 0:
        return None
    bins = int(np.clip(max(len(t["time_s"]) for t in kept) // 4, 20, BINS))
    return np.linspace(0.0, end, bins + 1)


def binned(t: dict[str, np.ndarray], column: str, edges: np.ndarray) -> np.ndarray:
    """The mean of ``column`` over the steps that ended in each slice of ``edges``; a slice in which none
    ended takes the value of the step that was running through it, and is NaN (idle) when none was."""
    time = t["time_s"]
    idx = np.clip(np.searchsorted(edges, time, side="left") - 1, 0, len(edges) - 2)
    counts = np.bincount(idx, minlength=len(edges) - 1).astype(float)
    sums = np.bincount(idx, weights=t[column].astype(float), minlength=len(edges) - 1)
    with np.errstate(invalid="ignore", divide="ignore"):
        means = np.where(counts > 0, sums / counts, np.nan)
    if "duration_s" in t:  # the next step to end after an empty slice ran through it if it began before its end
        nxt = np.searchsorted(time, edges[1:], side="left")
        ok = nxt < len(time)
        at = np.clip(nxt, 0, len(time) - 1)
        through = (counts == 0) & ok & (time[at] - t["duration_s"][at] < edges[1:])
        means = np.where(through, t[column][at].astype(float), means)
    return means


def _combined(r: RunData, column: str, how: str, edges: np.ndarray) -> np.ndarray:
    parts = np.array([binned(t, column, edges) for t in r.timelines if len(t.get("time_s", ()))])
    if len(parts) == 1:
        return parts[0]
    idle = np.isnan(parts).all(axis=0)
    value = np.nansum(parts, axis=0) if how == "sum" else np.nanmean(np.where(np.isnan(parts), 0.0, parts), axis=0)
    return np.where(idle, np.nan, value)


def over_time(runs: list[RunData], column: str, out: Path) -> Figure | None:
    """``column`` of the timeline against the run's time, a line per run (a cluster: its replicas combined)."""
    timed = [(i, r) for i, r in enumerate(runs) if any(len(t.get("time_s", ())) for t in r.timelines)]
    edges = _edges([r for _, r in timed])
    if edges is None:
        return None
    title, ylabel, how, caption = SERIES[column]
    scale = 100.0 if column == "kv_used" else 1.0
    mids = (edges[:-1] + edges[1:]) / 2
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=SIZE)
    for i, r in timed:
        ax.plot(mids, _combined(r, column, how, edges) * scale, color=_colour(i), label=r.label, linewidth=1.2,
                **DOTS)
    ax.set_xlabel("time since the run started (s)")
    ax.set_ylabel(ylabel)
    ax.set_ylim(bottom=0)
    ax.set_xlim(0, edges[-1])
    clustered = any(r.num_replicas > 1 for _, r in timed)
    ax.set_title(title + (" (clusters: replicas " + ("summed" if how == "sum" else "averaged") + ")"
                          if clustered else ""))
    name = _save(fig, ax, out, f"{column}_over_time.png", len(timed) > 1)
    return Figure(name, title, caption + f" {len(edges) - 1} slices of {edges[1]:.3g} s; gaps: no step ran (idle).")


def _cumulative_on(t: dict[str, np.ndarray], edges: np.ndarray) -> np.ndarray:
    """The running count of preemptions at each slice's end (0 before the first step)."""
    at = np.searchsorted(t["time_s"], edges[1:], side="right") - 1
    counts = t["preemptions"]
    return np.where(at >= 0, counts[np.clip(at, 0, None)], 0).astype(float)


def preemptions(runs: list[RunData], out: Path) -> Figure | None:
    """Preemptions so far against time, a line per run (a cluster: its replicas summed)."""
    timed = [(i, r) for i, r in enumerate(runs) if any(len(t.get("time_s", ())) for t in r.timelines)]
    edges = _edges([r for _, r in timed])
    if edges is None:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=SIZE)
    totals = []
    for i, r in timed:
        series = sum(_cumulative_on(t, edges) for t in r.timelines if len(t.get("time_s", ())))
        total = int(r.summary.get("num_preemptions") or 0)
        totals.append(f"{r.label}: {total:,}")
        ax.step(np.concatenate([[0.0], edges[1:]]), np.concatenate([[0.0], series]), where="post",
                color=_colour(i), label=f"{r.label} ({total:,})")
    ax.set_xlabel("time since the run started (s)")
    ax.set_ylabel("preemptions so far")
    ax.set_ylim(bottom=0, top=max(1.0, ax.get_ylim()[1]))
    ax.set_xlim(0, edges[-1])
    ax.set_title("Preemptions")
    name = _save(fig, ax, out, "preemptions_over_time.png", len(timed) > 1)
    return Figure(name, "Preemptions", "Preemptions so far (a steep rise: the pool ran out and running requests "
                  "lost their KV or were swapped out). In all: " + "; ".join(totals) + ".")


# ---- clusters ---------------------------------------------------------------------------------
def replica_load(r: RunData, index: int, out: Path) -> Figure | None:
    """Run ``r`` (a cluster): each replica's running requests and KV use over time, a line per replica."""
    timed = [(j, t) for j, t in enumerate(r.timelines) if len(t.get("time_s", ()))]
    edges = _edges([r])
    if r.num_replicas < 2 or edges is None or not timed:
        return None
    roles = [p.get("role", "") for p in r.summary.get("per_replica") or []]
    mids = (edges[:-1] + edges[1:]) / 2
    plt = _pyplot()
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(SIZE[0], SIZE[1] * 1.6), sharex=True)
    for j, t in timed:
        role = f" ({roles[j]})" if j < len(roles) and roles[j] not in ("", "mixed") else ""
        top.plot(mids, binned(t, "running", edges), color=_colour(j), label=f"replica {j}{role}", linewidth=1.1,
                 **DOTS)
        bottom.plot(mids, binned(t, "kv_used", edges) * 100, color=_colour(j), linewidth=1.1, **DOTS)
    top.set_ylabel("requests running")
    top.set_title(f"{r.label}: load per replica")
    top.legend(fontsize=8, loc="best", ncol=2 if len(timed) > 4 else 1)
    top.grid(alpha=0.3)
    top.set_ylim(bottom=0)
    bottom.set_ylabel("KV blocks used (%)")
    bottom.set_ylim(bottom=0)
    bottom.set_xlabel("time since the run started (s)")
    bottom.set_xlim(0, edges[-1])
    name = _save(fig, bottom, out, f"replicas_{index}.png", False)
    return Figure(name, f"Load per replica: {r.label}",
                  f"Each replica's requests running (top) and KV pool use (bottom), mean per {edges[1]:.3g} s "
                  "slice: one replica busier than the others shows as a line above them.")


def routing(runs: list[RunData], out: Path) -> Figure | None:
    """Where the router sent the requests: per replica, requests placed and busy share; bars per run."""
    clustered = [(i, r) for i, r in enumerate(runs) if r.num_replicas > 1]
    if not clustered:
        return None
    plt = _pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(SIZE[0] * 1.2, SIZE[1]))
    width = 0.8 / len(clustered)
    for k, (i, r) in enumerate(clustered):
        per = r.summary["per_replica"]
        x = np.arange(len(per)) + (k - (len(clustered) - 1) / 2) * width
        router = r.summary.get("router", "?")
        left.bar(x, [p.get("num_requests", 0) for p in per], width, color=_colour(i),
                 label=f"{r.label} (router={router}, imbalance {r.summary.get('load_imbalance', float('nan')):.2f})")
        right.bar(x, [100 * p.get("busy_fraction", 0.0) for p in per], width, color=_colour(i))
    widest = max((r for _, r in clustered), key=lambda r: r.num_replicas)
    ticks = [f"{p.get('index', j)}" + (f"\n{p['role']}" if p.get("role", "mixed") != "mixed" else "")
             for j, p in enumerate(widest.summary["per_replica"])]
    for ax, ylabel in ((left, "requests placed"), (right, "busy (% of the run)")):
        ax.set_xticks(range(len(ticks)), ticks)
        ax.set_xlabel("replica")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3, axis="y")
    right.set_ylim(0, 105)
    left.set_title("Requests placed per replica")
    right.set_title("Time busy per replica")
    fig.legend(*left.get_legend_handles_labels(), fontsize=8, loc="lower center", ncol=min(2, len(clustered)))
    fig.tight_layout(rect=(0, 0.06 * ((len(clustered) + 1) // 2), 1, 1))
    fig.savefig(out / "routing.png", dpi=DPI)
    plt.close(fig)
    return Figure("routing.png", "Routing", "Requests the router placed on each replica (left; imbalance: the "
                  "most loaded replica's count over the mean of its role) and the share of the run each replica "
                  "spent computing steps (right).")


# ---- KV tiers ---------------------------------------------------------------------------------
def tier_hits(runs: list[RunData], out: Path) -> Figure | None:
    """Hit rate of each tier below the GPU (blocks loaded from it / lookups) and of all of them, bars per run."""
    tiered = [(i, r) for i, r in enumerate(runs) if r.summary.get("kv_tiers")]
    if not tiered:
        return None
    groups: list[str] = []
    for _, r in tiered:
        for t in r.summary["kv_tiers"]:
            if t.get("kind") not in groups:
                groups.append(t.get("kind"))
    groups.append("any tier")
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=SIZE)
    width = 0.8 / len(tiered)
    for k, (i, r) in enumerate(tiered):
        by_kind = {t.get("kind"): t.get("hit_rate") or 0.0 for t in r.summary["kv_tiers"]}
        by_kind["any tier"] = r.summary.get("kv_tier_hit_rate") or 0.0
        x = np.arange(len(groups)) + (k - (len(tiered) - 1) / 2) * width
        values = [100 * by_kind.get(g, 0.0) for g in groups]
        bars = ax.bar(x, values, width, color=_colour(i),
                      label=f"{r.label} (kv_tier_policy={r.summary.get('kv_tier_policy', '?')})")
        ax.bar_label(bars, fmt="%.1f%%", fontsize=7)
    ax.set_xticks(range(len(groups)), groups)
    ax.set_ylabel("hit rate (% of lookups)")
    ax.set_ylim(0, 105)
    ax.set_title("KV tier hit rates")
    name = _save(fig, ax, out, "kv_tier_hits.png", True)
    lookups = "; ".join(f"{r.label}: {r.summary.get('kv_tier_lookup_blocks', 0):,} lookups, "
                        f"{r.summary.get('kv_tier_requests_loaded', 0):,} requests loaded" for _, r in tiered)
    return Figure(name, "KV tier hit rates", "Blocks loaded from each tier below the GPU over the blocks looked "
                  f"up there ({lookups}).")


SPLIT = (("queueing", "queueing"), ("load", "KV load"), ("prefill_and_rest", "prefill and the rest"))


def tier_load(runs: list[RunData], out: Path) -> Figure | None:
    """Mean TTFT in parts (queueing, the tier load, the rest) and the load time added or hidden, per run."""
    tiered = [(i, r) for i, r in enumerate(runs) if r.summary.get("kv_tiers")]
    if not tiered:
        return None
    plt = _pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(SIZE[0] * 1.2, SIZE[1] + 0.3 * len(tiered)),
                                      gridspec_kw={"width_ratios": [3, 2]})
    labels = [r.label for _, r in tiered]
    y = np.arange(len(tiered))
    base = np.zeros(len(tiered))
    for k, (key, name) in enumerate(SPLIT):
        values = np.array([float((r.summary.get("kv_tier_ttft_split_ms") or {}).get(key) or 0.0) for _, r in tiered])
        bars = left.barh(y, values, 0.5, left=base, color=f"C{k}", label=name)
        left.bar_label(bars, labels=[f"{v:.3g}" if v else "" for v in values], label_type="center", fontsize=7)
        base += values
    left.set_yticks(y, labels, fontsize=8)
    left.set_ylim(-0.6, len(tiered) - 0.4)
    left.set_xlabel("mean TTFT (ms)")
    left.set_title("Mean TTFT in parts")
    left.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=3)
    left.grid(alpha=0.3, axis="x")
    for k, (key, name, colour) in enumerate((("kv_tier_load_added_s", "added to steps", "C3"),
                                             ("kv_tier_load_hidden_s", "hidden behind compute", "C2"))):
        load_ms = [1000 * float(r.summary.get(key) or 0.0) for _, r in tiered]
        bars = right.barh(y - (k - 0.5) * 0.35, load_ms, 0.35, color=colour, label=name)
        right.bar_label(bars, fmt="%.3g ms", fontsize=7, padding=2)
    right.set_yticks(y, labels if len(tiered) > 1 else [""], fontsize=8)
    right.set_ylim(-0.6, len(tiered) - 0.4)
    right.set_xlim(0, right.get_xlim()[1] * 1.25)  # room for the values
    right.set_xlabel("tier load time, whole run (ms)")
    right.set_title("Tier load time")
    right.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.2), ncol=2)
    right.grid(alpha=0.3, axis="x")
    fig.tight_layout()
    fig.savefig(out / "kv_tier_load.png", dpi=DPI)
    plt.close(fig)
    per = "; ".join(f"{r.label}: {_ms(1000 * float(r.summary.get('kv_tier_load_s_per_loaded_request_mean') or 0.0))}"
                    for _, r in tiered)
    return Figure("kv_tier_load.png", "KV tier load time",
                  "Left: mean TTFT as queueing, the step time a request's own tier load added, and the rest "
                  "(kv_tier_ttft_split_ms). Right: link time the loads added to steps and the time compute hid "
                  f"(kv_tiers.load=overlap). Mean load per loaded request: {per}.")
