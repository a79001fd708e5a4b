"""scripts/gpu_check.sh, the first GPU lease's one command, run here as its CPU dry run (the CI twin of
the GPU run), and the offline set-up it relies on (scripts/gpu_wheels.sh's list, scripts/gpu_site.py)."""

from __future__ import annotations

import ast
import importlib.metadata
import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path


REPO = Path(__file__).resolve().parents[1]
STAGES = ["site", "env", "kernels", "tp", "profile_ops", "host", "serve"]
# What the GPU machine brings (docs/testing.md): these and everything they require.
BASE = ["torch", "triton", "transformers"]
# Dependencies the checks do not need, and why the wheels leave them out.
NOT_CARRIED = {
    "wandb": "the checks run logger=none",
    "matplotlib": "plots only (servelab compare, bench-curve)",
    "fastapi": "servelab serve (the serve extra)",
    "uvicorn": "servelab serve (the serve extra)",
    "prometheus-client": "servelab serve (the serve extra)",
    "pydantic": "servelab serve (the serve extra)",
    "httpx": "servelab route (the serve extra)",
}


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def run_script(*args: str, env: dict | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    full = dict(os.environ, PYTHON=sys.executable, **(env or {}))
    return subprocess.run(["bash", str(REPO / "scripts" / "gpu_check.sh"), *args], cwd=REPO, env=full,
                          capture_output=True, text=True, timeout=timeout)


def test_cpu_dry_run_passes_every_stage_or_skips_it_with_a_reason_and_writes_every_figure(tmp_path):
    """The CI twin of the GPU run (one test, not a shared fixture: xdist could run a fixture twice)."""
    out = tmp_path / "out"
    proc = run_script(str(out), "--device", "cpu", "--pack", str(tmp_path / "pack"),
                      env={"SERVELAB_WHEELS": str(tmp_path / "no-wheels"), "TMPDIR": str(tmp_path)})
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert [s["stage"] for s in summary["stages"]] == STAGES
    for s in summary["stages"]:
        assert s["status"] in ("ok", "skipped"), (s, (out / f"{s['stage']}.log").read_text()[-3000:])
        assert s["status"] == "ok" or s["reason"], s
        assert (out / f"{s['stage']}.log").is_file() or s["status"] == "skipped"
    tp = next(s for s in summary["stages"] if s["stage"] == "tp")
    assert tp["status"] == "skipped" and "CUDA" in tp["reason"]
    assert summary["ok"] and summary["env"]["torch"]
    # the work folder (checkpoint, linked tree) is gone; the packed copy and its summary came back
    assert not list(tmp_path.glob("gpu_check.*"))
    assert {p.name for p in (tmp_path / "pack").iterdir()} == {"gpu_check.tar.gz", "summary.json", "summary.md"}

    tables = out / "op_tables" / "cpu" / "tiny_code"
    assert json.loads((tables / "manifest.json").read_text())["format"] == "servelab-op-tables/1"
    assert (tables / "ops.csv").is_file()
    kernels = json.loads((out / "kernels" / "kernels.json").read_text())
    assert kernels["checks"] and all(c["ok"] for c in kernels["checks"]) and kernels["bandwidth"]
    host = json.loads((out / "host" / "host_cost.json").read_text())
    assert host["fit"]["steps"] > 0 and host["fit"]["decode_host_us_by_batch"] and summary["host"] == host
    compare = json.loads((out / "serve" / "compare.json").read_text())
    assert compare["same_workload"] and not compare["failures"]
    real, sims = compare["real"]["figures"], compare["sims"]
    assert set(sims) == {"auto", "op_profile"}  # op_profile priced from the tables profile_ops just wrote
    for figures in (real, sims["auto"]["figures"], sims["op_profile"]["figures"]):
        assert figures["num_finished"] == figures["num_requests"] > 0
        for label in ("output throughput (tok/s)", "TTFT p50 (ms)", "TTFT p90 (ms)", "TPOT p50 (ms)", "E2E p50 (ms)"):
            assert figures[label] > 0, (label, figures)
    assert compare["ratio_sim_over_real"]["auto"]["TPOT p50 (ms)"] > 0
    page = (out / "serve" / "compare.md").read_text()
    assert "| TTFT p50 (ms) |" in page and "Not a fidelity figure" in page


def test_without_a_gpu_the_gpu_stages_fail_with_a_reason_and_the_rest_still_run(tmp_path):
    proc = run_script(str(tmp_path / "out"), "--device", "cuda", env={"SERVELAB_WHEELS": str(tmp_path / "none")},
                      timeout=300)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    stages = {s["stage"]: s for s in json.loads((tmp_path / "out" / "summary.json").read_text())["stages"]}
    assert list(stages) == STAGES
    assert stages["site"]["status"] == stages["env"]["status"] == "ok"
    for name in ("kernels", "tp", "profile_ops", "host", "serve"):
        assert stages[name]["status"] == "failed" and "no CUDA device visible" in stages[name]["reason"]
    assert "a stage FAILED" in (tmp_path / "out" / "summary.md").read_text()


def test_bad_arguments_are_one_line_and_exit_2(tmp_path):
    for args, said in ((["--device", "tpu", str(tmp_path)], "--device must be cuda or cpu, not tpu"),
                       ([], "OUT (the output folder) is required"),
                       ([str(tmp_path), "--frobnicate"], "unknown option --frobnicate")):
        proc = run_script(*args, timeout=30)
        assert proc.returncode == 2 and f"gpu_check: {said}" in proc.stderr, proc.stderr


def wheel_list() -> list[str]:
    text = (REPO / "scripts" / "gpu_wheels.sh").read_text()
    body = re.search(r"^WHEELS=\((.*?)^\)", text, re.S | re.M).group(1)
    return [line.split("#")[0].strip() for line in body.splitlines() if line.split("#")[0].strip()]


def requirement_closure(names: list[str]) -> set[str]:
    """``names`` and everything they require here (no extras), as canonical names."""
    from packaging.requirements import Requirement

    seen: set[str] = set()
    todo = [canonical(n) for n in names]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = importlib.metadata.requires(name) or []
        except importlib.metadata.PackageNotFoundError:
            continue
        for line in requires:
            req = Requirement(line)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(canonical(req.name))
    return seen


def test_the_wheel_list_covers_servelabs_runtime_dependencies():
    wheels = {canonical(n) for n in wheel_list()}
    covered = wheels | requirement_closure(BASE)
    not_carried = {canonical(n) for n in NOT_CARRIED}
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    from packaging.requirements import Requirement

    deps = {canonical(Requirement(d).name) for d in project["dependencies"]}
    assert deps - covered - not_carried == set(), "add these to WHEELS in scripts/gpu_wheels.sh"
    # what the carried wheels need comes along too (pip installs them with --no-deps)
    assert requirement_closure(sorted(wheels)) - covered == set()
    # and every third-party module servelab imports comes from a covered distribution
    dist_of = importlib.metadata.packages_distributions()
    missing = {}
    for root in ("framework", "plugins", "kernels"):
        for path in (REPO / root).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                         [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module else [])
                for name in names:
                    top = name.split(".")[0]
                    if top in sys.stdlib_module_names or top == "servelab":
                        continue
                    dists = {canonical(d) for d in dist_of.get(top, [top])}
                    if not dists & (covered | not_carried):
                        missing[top] = str(path.relative_to(REPO))
    assert missing == {}, "imported but neither carried nor brought by torch/triton/transformers"


def test_gpu_site_links_servelab_with_its_entry_points(tmp_path):
    """Where servelab is not installed (the GPU machine) the linked tree and its dist-info make it importable."""
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "gpu_site.py"), str(tmp_path / "py"), "--force-tree"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    path = done.stdout.strip()
    assert path == str(tmp_path / "py" / "tree")
    info = next((tmp_path / "py" / "tree").glob("servelab-*.dist-info"))
    assert "builtin = servelab.plugins.builtin" in (info / "entry_points.txt").read_text()
    check = subprocess.run([sys.executable, str(REPO / "scripts" / "gpu_site.py"), "--check"], capture_output=True,
                           text=True, timeout=120, env=dict(os.environ, PYTHONPATH=path))
    assert check.returncode == 0, check.stdout + check.stderr
    assert re.search(rf"^servelab .*{re.escape(path)}/servelab \(entry points: builtin", check.stdout, re.M), check.stdout


def test_the_lease_prediction_prices_the_catalogue_llama3_8b():
    """The serve stage's simulator side (model=tiny carrying the shape) is model=llama3_8b exactly."""
    sys.path.insert(0, str(REPO / "experiments"))
    try:
        import gpu_check_serve as serve
    finally:
        sys.path.remove(str(REPO / "experiments"))
    from servelab.api import compose
    from servelab.assemble.stack import build_stack

    p = serve.PRESETS["llama3_8b"]
    ours = build_stack(compose(serve.sim_overrides("llama3_8b", p, "h200", ["time_model=auto"])))
    catalogue = build_stack(compose(["backend=sim", "model=llama3_8b", "hardware=h200", "time_model=auto",
                                     *serve.workload_overrides(p)]))
    assert ours.time_model.describe() == catalogue.time_model.describe()
    assert ours.executor.num_kv_blocks == catalogue.executor.num_kv_blocks
    assert ours.executor.spec.vocab_size == catalogue.executor.spec.vocab_size == 128256
