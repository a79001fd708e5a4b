#!/usr/bin/env bash
# Prepare .whl/: the wheels scripts/gpu_check.sh installs on a GPU machine that has Python 3.12, torch,
# triton and transformers but no network (docs/testing.md, "The first GPU lease").
#
#   bash scripts/gpu_wheels.sh            # here, with network (a package index), once before the lease
#
# The list is what servelab imports at run time beyond torch, triton, transformers and what they
# require (numpy, safetensors, tqdm, ...); tests/test_gpu_check_script.py checks that it covers
# pyproject.toml's dependencies and servelab's imports. Left out on purpose: wandb (the checks run
# logger=none), matplotlib (plots only), the serve extra (fastapi, uvicorn, ...). Each wheel is the
# version this checkout's Python has installed, for CPython 3.12 on x86-64 Linux: pip download
# --only-binary, or pip wheel from the sdist for a pure-Python package that publishes no wheel
# (antlr4-python3-runtime 4.9.3, which omegaconf 2.3 pins). One version of each: .whl/ is emptied first.
set -euo pipefail
cd "$(dirname "$0")/.."

WHEELS=(
  hydra-core               # servelab.api / run.py compose the config
  omegaconf                # hydra-core's config objects
  antlr4-python3-runtime   # omegaconf's and hydra-core's grammar (pinned 4.9.*)
  PyYAML                   # omegaconf, servelab's yaml files
  pluggy                   # servelab.core.registry (plugin discovery)
  rich                     # the banner and reports
  markdown-it-py           # rich
  mdurl                    # markdown-it-py
  pygments                 # rich
)

PYTHON=${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}
DEST=${1:-.whl}
PLATFORMS=(--platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64)

grep -qx '/.whl/' .gitignore || echo "gpu_wheels: warning: .gitignore does not ignore /.whl/" >&2
rm -rf "$DEST"
mkdir -p "$DEST"
for name in "${WHEELS[@]}"; do
  version=$("$PYTHON" -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$name") || {
    echo "gpu_wheels: $name is not installed in $PYTHON (bash scripts/dev.sh sets up .venv)" >&2; exit 1; }
  if ! "$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      "${PLATFORMS[@]}" -d "$DEST" "$name==$version" 2>/dev/null; then
    # no wheel published: build one from the sdist; only a pure-Python one (py3-none-any) will do
    "$PYTHON" -m pip wheel -q --no-deps --no-binary=:all: -w "$DEST" "$name==$version" 2>/dev/null || {
      echo "gpu_wheels: no wheel and no sdist of $name==$version found" >&2; exit 1; }
    built=$(ls "$DEST" | grep -i "^${name//-/_}-$version-")
    case "$built" in *-py3-none-any.whl|*-py2.py3-none-any.whl) ;;
      *) echo "gpu_wheels: $built was built for this machine, not CPython 3.12 x86-64" >&2; exit 1 ;; esac
  fi
done
echo "gpu_wheels: $(ls "$DEST" | wc -l) wheels, $(du -sh "$DEST" | cut -f1) in $DEST:"
ls "$DEST"
