"""Price the same measurements with another form of the profile: refit the probe steps a run of
``run.py`` stored, with and without knots on the decode term, and predict workload B again.

    python experiments/time_model_fidelity/refit.py outputs/time_model_fidelity/<time>

Both fits see the same probe steps and are compared with the same wall-clock runs of B, so the
difference between the two rows is the profile's form alone, not the machine's load.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from run import COMMON, METRICS, WORKLOAD_B, run


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", type=Path, help="a folder run.py wrote (profile.json, wall-*/)")
    args = ap.parse_args()
    from servelab.sim.step_profile import StepProfile, fit_profile
    from servelab.core.step_work import StepWork

    prof = StepProfile.load(args.out / "profile.json")
    col = {name: i for i, name in enumerate(prof.to_json()["features"])}
    works = [StepWork(prefill_tokens=int(r[col["prefill_tokens"]]), decode_seqs=int(r[col["decode_seqs"]]),
                      attended=round(r[col["attended_k"]] * 1e3), context_tokens=round(r[col["context_k"]] * 1e3))
             for r in prof.samples]
    seconds = [r[-1] for r in prof.samples]
    measured = [json.loads(p.read_text()) for p in sorted(args.out.glob("wall-*/summary.json"))]
    print("| decode knots | " + " | ".join(name for name, _ in METRICS) + " |\n|---|" + "---:|" * len(METRICS))
    for knots in ((), prof.decode_knots):
        refit = fit_profile(works, seconds, knots=prof.knots, decode_knots=knots, source=prof.source)
        for feature in ("swap_blocks", "copy_blocks"):  # priced from the measured copy, not fitted
            refit.set_coefficient(feature, prof.coefficients[prof.feature_index(feature)])
        name = "-".join(map(str, knots)) or "none"
        path = refit.save(args.out / f"refit-{name}.json")
        predicted = run(COMMON + WORKLOAD_B + ["clock=virtual", "time_model=profile", f"time_model.path={path.resolve()}"],
                        args.out / f"refit-{name}")
        errors = [get(predicted) / statistics.median(get(s) for s in measured) - 1 for _, get in METRICS]
        print(f"| {', '.join(map(str, knots)) or 'none'} | " + " | ".join(f"{e:+.1%}" for e in errors) + " |")


if __name__ == "__main__":
    main()
