#!/usr/bin/env bash
# 2 x H200 (device kind nvidia-h200-x2), from the repository root, < 6 minutes:
#   (a) equivalence: GRPO LoRA / full-parameter and PPO with a critic, K steps on 1 GPU and
#       on 2 GPUs (danka train --nproc 2): same weights within the stated tolerance;
#   (b) scaling: GRPO step on the Qwen2.5-0.5B shape, 1 vs 2 GPUs at the same global batch,
#       peak memory per GPU, time breakdown.
# Writes $OUT/scale_2x.json (when OUT is set) and bench/results/scale_2x.json.
set -uo pipefail
# This machine's NCCL setting, not danka's: NVLink multicast must stay off on these shared
# hosts (a program using it can put the host's GPUs out of service). Set here, inherited by
# torchrun and every rank.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
if ls .whl/*.whl >/dev/null 2>&1; then  # carried wheels (datasets, math-verify, ...)
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader
nvidia-smi topo -m 2>/dev/null | head -4
outs=(--out bench/results/scale_2x.json)
[ -n "${OUT:-}" ] && outs+=(--out "$OUT/scale_2x.json")
timeout 350 python3 bench/bench_scale.py --work /tmp/danka_scale "${outs[@]}" "$@"
