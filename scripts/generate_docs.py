"""Write the generated parts of the pages (README.md, docs/*.md) and the grade presets
(conf/experiment/grade_*.yaml) from the kinds table and the kit: ``python scripts/generate_docs.py``.

Run it after changing a kind (``servelab.core.kinds``), a conformance stage, a grade workload or a
score rule; ``tests/test_docs_kinds.py`` fails until the pages say what this writes. ``--check``
writes nothing and exits 1 naming what is stale (and each guide that falls short).
"""

from __future__ import annotations

import sys
from pathlib import Path

from servelab.kit.grade_presets import stale_presets, write_presets
from servelab.kit.kind_docs import guide_problems, stale_pages, write_all

REPO = Path(__file__).resolve().parents[1]


def main(argv: list[str]) -> int:
    if "--check" in argv:
        stale = stale_pages(REPO) + stale_presets(REPO)
        problems = guide_problems(REPO)
        for line in [*(f"stale: {s}" for s in stale), *problems]:
            print(line)
        return 1 if stale or problems else 0
    for path in [*write_all(REPO), *write_presets(REPO)]:
        print(f"wrote {path.relative_to(REPO)}")
    for problem in guide_problems(REPO):
        print(f"to do by hand: {problem}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
