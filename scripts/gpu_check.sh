#!/usr/bin/env bash
# The first GPU lease in one command: every GPU check of servelab, each figure written under OUT.
#
#   bash scripts/gpu_check.sh OUT                      # a GPU machine (an H200: under 10 minutes)
#   bash scripts/gpu_check.sh OUT --pack DIR           # ... and DIR/gpu_check.tar.gz + DIR/summary.{json,md}
#   bash scripts/gpu_check.sh OUT --device cpu         # the dry run on CPU, tiny shapes (tests/test_gpu_check_script.py)
#
# For a machine with Python, torch, triton and transformers but no network: the wheels in .whl/
# (bash scripts/gpu_wheels.sh, run beforehand where there is network) are installed into a temporary
# folder, and servelab is imported from this checkout (scripts/gpu_site.py); docs/testing.md, "The
# first GPU lease". Stages, in order; each one's output goes to OUT/<stage>.log:
#   site         the wheels and servelab's import path; what imports from where
#   env          versions, GPUs, nvidia-smi -> OUT/env.json
#   kernels      tests/test_kernels_triton.py, then experiments/gpu_check_kernels.py (Triton against the
#                torch reference, decode-attention bandwidth) -> OUT/kernels/kernels.{md,json}
#   tp           experiments/gpu_check_tp.py (TP=2 tokens equal TP=1's) with >= 2 GPUs -> OUT/tp/
#   profile_ops  experiments/gpu_check_ops.py: servelab profile-ops on a Llama-3-8B layer, bfloat16 ->
#                OUT/op_tables/<hardware>/llama3_8b/ (the op tables of this GPU)
#   host         benchmarks/host_cost.py: servelab's own host time per engine step on this machine (the
#                real engine, decode batches 1..64: scheduling, batch building, applying tokens) ->
#                OUT/host/host_cost.json (an engine.host block for engine=servelab; docs/simulator.md "Engines")
#   serve        experiments/gpu_check_serve.py: a Llama-3-8B-shaped random checkpoint on the real
#                engine beside the simulator's prediction (hardware=h200) -> OUT/serve/compare.{json,md}
# A failing stage does not stop the later ones. OUT/summary.json lists each stage (ok, failed or
# skipped, its seconds, and why), OUT/summary.md the stages and figures. Exit status: 0 when no stage
# failed, 1 otherwise, 2 for bad arguments. Each stage is cut at its own limit and within --budget-s
# (default 540 on cuda, 300 on cpu), keeping time for the serve stage. --device cpu: the same stages,
# CPU-sized (tiny_code's shape, a few requests; the Triton tests that need no interpreter); tp skipped.
# PYTHON (default python3) is the interpreter; SERVELAB_WHEELS (default .whl) the folder of wheels.
set -u

usage() { sed -n '2,6p' "$0" | sed 's/^# \{0,1\}//' >&2; }
die() { echo "gpu_check: $*" >&2; usage; exit 2; }

OUT="" DEVICE=cuda PACK="" BUDGET=""
while [ $# -gt 0 ]; do
  case "$1" in
    --device) [ $# -ge 2 ] || die "--device needs a value"; DEVICE=$2; shift 2 ;;
    --device=*) DEVICE=${1#*=}; shift ;;
    --pack) [ $# -ge 2 ] || die "--pack needs a folder"; PACK=$2; shift 2 ;;
    --pack=*) PACK=${1#*=}; shift ;;
    --budget-s) [ $# -ge 2 ] || die "--budget-s needs seconds"; BUDGET=$2; shift 2 ;;
    --budget-s=*) BUDGET=${1#*=}; shift ;;
    -h|--help) usage; exit 0 ;;
    -*) die "unknown option $1" ;;
    *) [ -z "$OUT" ] || die "one OUT folder only (got $OUT and $1)"; OUT=$1; shift ;;
  esac
done
[ -n "$OUT" ] || die "OUT (the output folder) is required"
case "$DEVICE" in cuda|cpu) ;; *) die "--device must be cuda or cpu, not $DEVICE" ;; esac
BUDGET=${BUDGET:-$([ "$DEVICE" = cuda ] && echo 540 || echo 300)}
case "$BUDGET" in ''|*[!0-9]*) die "--budget-s must be whole seconds, not $BUDGET" ;; esac

REPO=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-python3}
mkdir -p "$OUT" || die "cannot create $OUT"
OUT=$(cd "$OUT" && pwd)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/gpu_check.XXXXXX")
trap 'rm -rf "$WORK"' EXIT
STAGES=$WORK/stages.tsv
: > "$STAGES"
export PY REPO OUT DEVICE WORK PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 WANDB_MODE=disabled
SECONDS=0

record() { printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" >> "$STAGES"; echo "gpu_check: $1: $2 ($3 s) $4"; }
skip() { record "$1" skipped 0 "$2"; }

# run_stage NAME LIMIT RESERVE: the function stage_NAME under `timeout`, at most LIMIT seconds and no
# more than leaves RESERVE seconds of the budget to the stages after it.
run_stage() {
  local name=$1 limit=$2 reserve=$3 left=$((BUDGET - SECONDS))
  [ $((left - reserve)) -lt "$limit" ] && limit=$((left - reserve))
  if [ "$limit" -lt 10 ]; then
    skip "$name" "no time left in --budget-s $BUDGET ($left s left, $reserve s kept for the stages after it)"; return
  fi
  echo "gpu_check: $name (at most $limit s) -> $OUT/$name.log"
  local t0=$EPOCHREALTIME rc
  (cd "$REPO" && timeout -k 10 "$limit" bash -c "stage_$name") > "$OUT/$name.log" 2>&1
  rc=$?
  local secs
  secs=$(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }')
  if [ $rc -eq 0 ]; then
    record "$name" ok "$secs" ""
  elif [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
    record "$name" failed "$secs" "timed out after $limit s (see $name.log)"
  else
    record "$name" failed "$secs" "exit $rc: $(grep -v '^[[:space:]]*$' "$OUT/$name.log" | tail -n 1 | cut -c1-200)"
  fi
}

# The folders gpu_site.py printed, first on PYTHONPATH (none: nothing changes; an empty entry would add the cwd).
add_pythonpath() {
  local entries
  entries=$(cat "$WORK/pythonpath" 2>/dev/null) || return 0
  if [ -n "$entries" ]; then export PYTHONPATH="$entries${PYTHONPATH:+:$PYTHONPATH}"; fi
}

stage_site() {
  set -e
  local wheels=() dir=${SERVELAB_WHEELS:-$REPO/.whl}
  if ls "$dir"/*.whl > /dev/null 2>&1; then wheels=(--wheels "$dir"); else
    echo "no wheels in $dir (bash scripts/gpu_wheels.sh): servelab's dependencies must be installed already"; fi
  "$PY" scripts/gpu_site.py "$WORK/py" "${wheels[@]}" > "$WORK/pythonpath"
  add_pythonpath
  echo "PYTHONPATH=${PYTHONPATH:-}"
  "$PY" scripts/gpu_site.py --check
}

stage_env() { "$PY" experiments/gpu_check_env.py "$OUT/env.json"; }

stage_kernels() {
  local rc=0
  if [ "$DEVICE" = cuda ]; then
    "$PY" -m pytest -q -p no:cacheprovider -o addopts=-ra tests/test_kernels_triton.py || rc=1
    "$PY" experiments/gpu_check_kernels.py --out "$OUT/kernels" || rc=1
  else  # the host-side tests only (the interpreted ones run in the default suite)
    "$PY" -m pytest -q -p no:cacheprovider -o addopts=-ra tests/test_kernels_triton.py -m "not interpreted" \
      -k "not fresh_process and not compile_for_sm90 and not interpret_set" || rc=1
    "$PY" experiments/gpu_check_kernels.py --device cpu --backend torch --batch 2 --max-context 64 --heads 4 \
      --kv-heads 2 --head-dim 16 --bench-contexts 64 --copy-numel 1048576 --out "$OUT/kernels" || rc=1
  fi
  return $rc
}

stage_tp() { "$PY" experiments/gpu_check_tp.py --out "$OUT/tp"; }

stage_profile_ops() { "$PY" experiments/gpu_check_ops.py "$OUT/op_tables" --device "$DEVICE"; }

stage_host() {
  mkdir -p "$OUT/host"
  if [ "$DEVICE" = cuda ]; then
    "$PY" benchmarks/host_cost.py backend.device=cuda backend.num_threads=null --batches 1 2 4 8 16 32 64 \
      --output-len 32 --json "$OUT/host/host_cost.json"
  else
    "$PY" benchmarks/host_cost.py --batches 1 2 4 --output-len 4 --json "$OUT/host/host_cost.json"
  fi
}

stage_serve() {
  "$PY" experiments/gpu_check_serve.py "$OUT/serve" --device "$DEVICE" --op-tables "$OUT/op_tables" \
    --work "$WORK/serve"
}
export -f add_pythonpath stage_site stage_env stage_kernels stage_tp stage_profile_ops stage_host stage_serve

SERVE_MIN=$([ "$DEVICE" = cuda ] && echo 240 || echo 60)
run_stage site 120 0
add_pythonpath
run_stage env 60 0
NGPU=$("$PY" -c "import json, sys; print(json.load(open(sys.argv[1]))['cuda_device_count'])" "$OUT/env.json" \
       2>/dev/null || echo 0)
if [ "$DEVICE" = cuda ] && [ "$NGPU" -eq 0 ]; then
  for s in kernels tp profile_ops host serve; do record "$s" failed 0 "no CUDA device visible (env.log; --device cpu: the dry run)"; done
else
  run_stage kernels 150 $((SERVE_MIN + 60))
  if [ "$DEVICE" = cpu ]; then
    skip tp "--device cpu: the TP token check needs 2 CUDA devices (CPU TP: tests/test_tp.py)"
  elif [ "$NGPU" -lt 2 ]; then
    skip tp "needs 2 CUDA devices (one per rank), $NGPU visible"
  else
    run_stage tp 240 $((SERVE_MIN + 60))
  fi
  run_stage profile_ops 200 "$SERVE_MIN"
  run_stage host 90 "$SERVE_MIN"
  run_stage serve 600 0
fi

"$PY" - "$STAGES" "$OUT" "$DEVICE" "$BUDGET" "$SECONDS" <<'EOF' || echo "gpu_check: could not write summary.json" >&2
import json, sys
from pathlib import Path

stages_tsv, out, device, budget, total = sys.argv[1:]
out = Path(out)
stages = []
for line in Path(stages_tsv).read_text().splitlines():
    name, status, secs, reason = line.split("\t")
    stages.append({"stage": name, "status": status, "seconds": float(secs), "reason": reason or None})
summary = {"device": device, "budget_s": int(budget), "total_s": int(total), "ok": all(s["status"] != "failed" for s in stages),
           "stages": stages}
for name, rel in (("env", "env.json"), ("host", "host/host_cost.json"), ("serve", "serve/compare.json")):
    f = out / rel
    if f.is_file():
        summary[name] = json.loads(f.read_text())
summary["op_tables"] = sorted(str(m.parent.relative_to(out)) for m in out.glob("op_tables/*/*/manifest.json"))
(out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
md = [f"# GPU check ({device}): {'every stage ok or skipped' if summary['ok'] else 'a stage FAILED'}", "",
      "| stage | status | seconds | why |", "|---|---|---|---|"]
md += [f"| {s['stage']} | {s['status']} | {s['seconds']:.0f} | {s['reason'] or ''} |" for s in stages]
md += ["", f"Op tables: {', '.join(summary['op_tables']) or 'none'}", ""]
for rel in ("kernels/kernels.md", "serve/compare.md"):
    if (out / rel).is_file():
        md += [f"## {rel}", "", (out / rel).read_text()]
(out / "summary.md").write_text("\n".join(md) + "\n")
EOF

if [ -n "$PACK" ]; then
  mkdir -p "$PACK" && tar -czf "$PACK/gpu_check.tar.gz" -C "$(dirname "$OUT")" "$(basename "$OUT")" \
    && cp "$OUT/summary.json" "$OUT/summary.md" "$PACK/" && echo "gpu_check: packed into $PACK" \
    || echo "gpu_check: packing into $PACK failed" >&2
fi
cat "$OUT/summary.md" 2>/dev/null
if grep -q "	failed	" "$STAGES"; then exit 1; fi
exit 0
