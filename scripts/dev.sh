#!/usr/bin/env bash
# Set up ./.venv once (again when pyproject.toml changes), then run servelab or its tests.
#
#   bash scripts/dev.sh run [hydra overrides...]   # python run.py ...
#   bash scripts/dev.sh test [pytest args...]      # python -m pytest -m "not slow" ... (-m slow: the rest)
#
# Torch: if the Python running this script already has a CUDA-enabled torch, the venv sees it
# (--system-site-packages) and nothing is reinstalled. Otherwise torch 2.13.0 is installed; on
# the project's machines that is the CPU build. Elsewhere set
# SERVELAB_TORCH_INDEX=https://download.pytorch.org/whl/cpu to get the CPU build from PyTorch's index.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
VENV=.venv
STAMP=$VENV/.servelab-installed

say() { echo "servelab set-up: $*" >&2; }

if [ ! -f "$STAMP" ] || [ pyproject.toml -nt "$STAMP" ]; then
  say "creating $VENV (once; again when pyproject.toml changes) - a few minutes"
  if "$PYTHON" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
    say "using this Python's CUDA torch ($("$PYTHON" -c 'import torch; print(torch.__version__)'))"
    "$PYTHON" -m venv --system-site-packages "$VENV"
  else
    "$PYTHON" -m venv "$VENV"
    say "1/2 installing torch 2.13.0${SERVELAB_TORCH_INDEX:+ from $SERVELAB_TORCH_INDEX} (the largest download)"
    "$VENV/bin/python" -m pip install --quiet torch==2.13.0 ${SERVELAB_TORCH_INDEX:+--index-url "$SERVELAB_TORCH_INDEX"}
  fi
  say "2/2 installing servelab[dev] in editable mode: hydra-core, omegaconf, pluggy, wandb, transformers," \
      "rich, matplotlib, triton, pytest, pytest-benchmark, hypothesis, Hydra launchers"
  "$VENV/bin/python" -m pip install --quiet -e '.[dev]'
  touch "$STAMP"
  say "done: $VENV"
fi

cmd=${1:-run}
shift || true
case "$cmd" in
  run) exec "$VENV/bin/python" run.py "$@" ;;
  # one pytest-xdist worker per core (work stealing: the slow tests do not queue behind one another);
  # SERVELAB_TEST_WORKERS=0 runs in this process, "-n N" in the arguments overrides it. Without a -m of
  # the caller's, the tests marked slow (each has a fast twin) are left out: -m slow runs them, -m "" all
  test)
    marker=(-m "not slow")
    for arg in "$@"; do case "$arg" in -m|-m*) marker=() ;; esac; done
    exec "$VENV/bin/pytest" -n "${SERVELAB_TEST_WORKERS:-auto}" --dist worksteal ${marker[@]+"${marker[@]}"} "$@" ;;
  *) echo "usage: bash scripts/dev.sh run|test [args...]" >&2; exit 2 ;;
esac
