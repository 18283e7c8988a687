#!/usr/bin/env bash
# On the GPU machine: join the parts scripts/vllm_wheels.sh made, check them, and install
# vLLM and its missing dependencies into a folder of their own (the machine's torch,
# numpy, numba and CUDA libraries stay as they are), then check that vLLM's kernels load.
#
#   bash scripts/vllm_install_parts.sh PARTS_DIR [TARGET]   # TARGET default /tmp/site
#   export PYTHONPATH=TARGET:$PYTHONPATH                   # then: danka train, the bench
#
# PARTS_DIR holds p1 .. pN and SHA256SUMS. Safe to re-run (TARGET is rebuilt).
set -euo pipefail
PARTS="${1:?usage: bash scripts/vllm_install_parts.sh PARTS_DIR [TARGET]}"
TARGET="${2:-/tmp/site}"
WORK="$(mktemp -d)"
(cd "$PARTS" && sha256sum -c SHA256SUMS)
cat $(ls "$PARTS"/p[0-9]* | sort -V) > "$WORK/wheels.tar"
tar -xf "$WORK/wheels.tar" -C "$WORK"
rm -rf "$TARGET"
python3 -m pip install -q --no-index --no-deps --no-compile --target "$TARGET" "$WORK"/wheels/*.whl
rm -rf "$WORK"
export PYTHONPATH="$TARGET${PYTHONPATH:+:$PYTHONPATH}" VLLM_ENABLE_V1_MULTIPROCESSING=0
python3 - <<'EOF'
import importlib

import torch
import vllm

# compiled ops built for this torch? (0.26 ships them as the stable-ABI _C_stable_libtorch)
for name in ("vllm._C", "vllm._C_stable_libtorch"):
    try:
        importlib.import_module(name)
        print("loaded", name)
        break
    except ModuleNotFoundError:
        continue
else:
    raise SystemExit("vLLM's compiled ops (vllm._C / vllm._C_stable_libtorch) are missing")
from vllm.vllm_flash_attn import flash_attn_interface as fa

print("vllm", vllm.__version__, "torch", torch.__version__, "cuda", torch.version.cuda)
print("FA3", fa.FA3_AVAILABLE, fa.FA3_UNAVAILABLE_REASON or "")
EOF
echo "installed into $TARGET: export PYTHONPATH=$TARGET:\$PYTHONPATH"
