"""Does a profile fitted on this machine predict a real run of a *different* workload?

    python experiments/time_model_fidelity/run.py [--repeats 3] [--out DIR] [overrides...]

1. ``servelab profile``'s probe (decode batches, a mixed Poisson load; fcfs) with
   ``backend.num_threads=1``, ``--repeats`` rounds, each followed by one wall-clock run of
   workload B (other lengths, another rate, another stack: ``scheduler=priority``, chunked
   prefill at a 256-token budget), so both sides sample the machine alike.
2. The profile (the median of each distinct probe step over the rounds) prices B once on the
   virtual clock.
3. The table: total duration, TTFT p50/p90, TPOT p50 predicted vs measured (median of repeats),
   error per metric and the spread of the measured repeats.

Results go to ``--out`` (default ``outputs/time_model_fidelity/<timestamp>``); nothing committed is
overwritten. Run it on a quiet machine: the wall-clock side is what is being predicted.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
from pathlib import Path

COMMON = ["model=tiny", "workload=synthetic", "backend.num_threads=1", "logger=none", "progress=false"]
WORKLOAD_B = ["workload.num_requests=48", "workload.rate=3", "workload.prompt_len.dist=lognormal",
              "workload.prompt_len.mean=200", "workload.prompt_len.max=1200", "workload.output_len.min=16",
              "workload.output_len.max=160", "scheduler=priority", "max_num_batched_tokens=256",
              "workload.seed=7"]
METRICS = [("duration_s", lambda s: s["duration_s"]), ("ttft_p50_ms", lambda s: s["ttft_ms"]["p50"]),
           ("ttft_p90_ms", lambda s: s["ttft_ms"]["p90"]), ("tpot_p50_ms", lambda s: s["tpot_ms"]["p50"])]


def run(overrides: list[str], out: Path) -> dict:
    from servelab.api import compose
    from servelab.run.session import run_job

    return run_job(compose(overrides), out).summary


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=Path("outputs/time_model_fidelity") / dt.datetime.now().strftime("%Y-%m-%d_%H-%M-%S"))
    ap.add_argument("overrides", nargs="*", help="extra Hydra overrides for every run (e.g. model=...)")
    args = ap.parse_args()
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    profile = out / "profile.json"
    from servelab.cli.profile import measure_profile

    base = COMMON + WORKLOAD_B + args.overrides
    # One probe round, then one wall-clock run of B, and again: on a shared machine both sides then
    # sample the same spells of other work, and the medians on both sides shed a burst in one.
    measured = []
    measure_profile([*COMMON, *args.overrides], rounds=args.repeats,
                    after_round=lambda r: measured.append(run(base, out / f"wall-{r}"))).save(profile)
    predicted = run(base + ["clock=virtual", "time_model=profile", f"time_model.path={profile.resolve()}"],
                    out / "virtual")
    rows = []
    for name, get in METRICS:
        values = [get(s) for s in measured]
        med = statistics.median(values)
        rows.append({"metric": name, "measured_median": med, "measured_min": min(values), "measured_max": max(values),
                     "predicted": get(predicted), "error": get(predicted) / med - 1})
    fit = json.loads(profile.read_text())["fit"]
    lines = [f"Profile: {fit['num_steps']} probe steps, R^2 {fit['r2']:.3f}; workload B: `{' '.join(WORKLOAD_B)}`",
             "", "| metric | measured (median of %d) | measured range | predicted (virtual clock, profile) | error |"
             % args.repeats, "|---|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['metric']} | {r['measured_median']:.3g} | {r['measured_min']:.3g} – {r['measured_max']:.3g} "
                     f"| {r['predicted']:.3g} | {r['error']:+.1%} |")
    (out / "results.md").write_text("\n".join(lines) + "\n")
    (out / "results.json").write_text(json.dumps(rows, indent=2) + "\n")
    print("\n".join(lines))
    print(f"\nwritten to {out}")


if __name__ == "__main__":
    main()
