"""The cluster-serving study, every section in one process: (a) routers, (b) colocated vs
disaggregated, (c) capacity.

    python experiments/cluster_serving/run.py                         # multirun/cluster_serving/<time>/<section>/
    python experiments/cluster_serving/run.py --update-readme         # experiments/cluster_serving/<section>/ + README
    python experiments/cluster_serving/run.py --only disagg           # one section (or several, comma-separated)
    python experiments/cluster_serving/run.py --quick --out /tmp/x    # a tiny version of each (the tests)

Each section is also a script of its own (``routers.py``, ``disagg.py``, ``capacity.py``) with its own
options (``--help``).
"""

from __future__ import annotations

import argparse
import sys
import time
from datetime import datetime
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import capacity  # noqa: E402
import disagg  # noqa: E402
import routers  # noqa: E402
from common import REPO  # noqa: E402

SECTIONS = {"routers": routers, "disagg": disagg, "capacity": capacity}


def main(argv=None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--update-readme", action="store_true",
                   help="write experiments/cluster_serving/<section>/ and rewrite the README's sections")
    p.add_argument("--out", default=None, help="results go to OUT/<section>/ (default: a fresh "
                   "multirun/cluster_serving/<date>_<time>/)")
    p.add_argument("--quick", action="store_true", help="a tiny version of every section (seconds; the tests)")
    p.add_argument("--only", default=",".join(SECTIONS), help="comma-separated sections: " + ", ".join(SECTIONS))
    args = p.parse_args(argv)
    only = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = [s for s in only if s not in SECTIONS]
    if unknown:
        p.error(f"unknown sections {unknown}; choose from {list(SECTIONS)}")
    if args.update_readme and args.quick:
        p.error("--quick results never replace the committed ones: drop --update-readme or --quick")
    common = ["--quick"] if args.quick else []
    if args.update_readme:
        common.append("--update-readme")
    else:
        out = Path(args.out) if args.out else REPO / "multirun" / "cluster_serving" / datetime.now().strftime("%Y-%m-%d_%H-%M-%S")
        common += ["--out", str(out)]
    t0 = time.perf_counter()
    results = {}
    for name in only:
        print(f"=== {name} ===", flush=True)
        results[name] = SECTIONS[name].main(common)
    print(f"cluster_serving: {', '.join(only)} in {(time.perf_counter() - t0) / 60:.1f} min wall", flush=True)
    return results


if __name__ == "__main__":
    main()
