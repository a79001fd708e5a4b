"""A simulated run never imports torch (about a second of start-up): single engines and clusters."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = """
import sys
from servelab.api import compose
from servelab.run.session import run_job
for extra in ([], ["cluster.replicas=2"]):
    cfg = compose(["backend=sim", "model=llama3_8b", "workload.num_requests=5", *extra], logger="none", progress=False)
    run_job(cfg, sys.argv[1] + "/" + str(len(extra)))
print(sorted(m for m in sys.modules if m == "torch" or m.startswith("torch.")))
"""


def test_a_simulated_run_imports_no_torch(tmp_path):
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path)], capture_output=True, text=True, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]", "a simulated run imported torch"
