"""A picture of every run: ``report.html`` and its figures (``servelab report``, ``report=true``).

- :mod:`.runs` reads a run folder (``summary.json``, ``requests.jsonl``, ``config.yaml``, ``timeline.npz``);
- :mod:`.figures` draws the figures (matplotlib, Agg), one per metric, a line per run;
- :mod:`.html` writes the page that shows them (no script, no file from elsewhere).

:func:`write_page` is the one entry point. Reading and drawing are apart so a figure can be tested on
a run in memory.
"""

from __future__ import annotations

from servelab.results.page.runs import ReportError, RunData, load_run, run_labels
from servelab.results.page.write import FIGURES_FOLDER, PAGE, write_page

__all__ = ["FIGURES_FOLDER", "PAGE", "ReportError", "RunData", "load_run", "run_labels", "write_page"]
