#!/usr/bin/env bash
# Install torch 2.13 for this machine (sourced by quickstart.sh and test.sh; safe to re-run).
#  - torch already importable: nothing to do;
#  - an NVIDIA GPU: the CUDA build from PyPI;
#  - no GPU: the CPU build. On Linux, `pip install torch==2.13.0` from PyPI resolves to the
#    CUDA build (GBs of NVIDIA libraries), so the CPU build comes from the PyTorch CPU wheel
#    index -- unless pip already sees a local torch 2.13.0 wheel (a find-links folder or a
#    mirror configured for pip), which is then used as is, without touching the network.
set -euo pipefail
TORCH_VERSION="${TORCH_VERSION:-2.13.0}"
TORCH_CPU_INDEX="${TORCH_CPU_INDEX:-https://download.pytorch.org/whl/cpu}"

install_torch() {
  if python3 -c "import torch" 2>/dev/null; then
    return 0
  fi
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    echo "installing torch==$TORCH_VERSION (CUDA build, a GPU is present)"
    python3 -m pip install -q "torch==$TORCH_VERSION"
  elif python3 -m pip install -q --dry-run --no-deps --no-index "torch==$TORCH_VERSION" \
      >/dev/null 2>&1; then
    echo "installing torch==$TORCH_VERSION from the local wheel pip found"
    python3 -m pip install -q "torch==$TORCH_VERSION"
  else
    echo "installing torch==$TORCH_VERSION (CPU build, from $TORCH_CPU_INDEX: PyTorch's own" \
      "wheel index, not PyPI; set TORCH_CPU_INDEX to a mirror, or install torch first)"
    python3 -m pip install -q "torch==$TORCH_VERSION" --index-url "$TORCH_CPU_INDEX"
  fi
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  install_torch
fi
