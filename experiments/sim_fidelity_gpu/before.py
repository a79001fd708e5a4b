"""The fidelity report's headline before issue 47 (engine presets): the committed ``e2e_results.json`` of
the page's earlier columns (``base``: every engine timing feature off; ``all``: every feature the
source's engine ran), summarised the way ``e2e.headline`` summarises the new columns.

    python experiments/sim_fidelity_gpu/before.py COMMIT    # writes e2e_before.json from COMMIT's e2e_results.json

It reads the file from git (``git show COMMIT:experiments/sim_fidelity_gpu/e2e_results.json``), so the
"before" figures are exactly the ones that commit published; ``e2e_page.py`` prints them beside the new ones.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import e2e  # noqa: E402

OUT = HERE / "e2e_before.json"


def summarise(results: dict, commit: str) -> dict:
    entries = results["entries"]
    by_source: dict[str, dict] = {}
    for e in entries:
        by_source.setdefault(e["source"]["short"], []).append(e)
    out = {"commit": commit, "columns": ["base", "all"], "entries": [e["id"] for e in entries],
           "headline": e2e.headline(entries, ("base", "all")), "by_source": {}}
    for source, rows in by_source.items():
        out["by_source"][source] = {}
        for col in ("base", "all"):
            for family in e2e.FAMILIES:
                errs = e2e.family_errors(rows, col, family)
                if errs:
                    out["by_source"][source][f"{col}/{family}"] = float(np.median([abs(x) for _, _, x in errs]))
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        raise SystemExit("usage: before.py COMMIT")
    commit = argv[0]
    text = subprocess.run(["git", "show", f"{commit}:experiments/sim_fidelity_gpu/e2e_results.json"],
                          capture_output=True, text=True, check=True, cwd=HERE).stdout
    OUT.write_text(json.dumps(summarise(json.loads(text), commit), indent=1) + "\n")
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
