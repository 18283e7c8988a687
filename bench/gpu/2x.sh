#!/usr/bin/env bash
# 2 x H200 (device kind nvidia-h200-x2), from the repository root, < 6 minutes:
#   (a) equivalence (GPU-marked test): GRPO LoRA / full-parameter (fp32 and bf16) and PPO
#       with a critic (fp32), 3 steps through `danka train` on 1 GPU and with --nproc 2:
#       same weights within 1e-3 (fp32) / 5e-2 (bf16) relative;
#   (b) scaling: GRPO + LoRA step on the Qwen2.5-0.5B shape (random weights), 1 vs 2 GPUs
#       at the same global batch, fast then HF rollout engine: step time, tokens/s,
#       peak memory per GPU, update overhead and imbalance between ranks.
# Writes bench/results/{equivalence_2x,scale_2x}.json and copies them to $OUT when set.
# Exit status: that of the equivalence test (0 = every case within tolerance).
set -uo pipefail
# This machine's NCCL setting, not danka's: NVLink multicast must stay off on these shared
# hosts (a program using it can put the host's GPUs out of service). Exported here, so
# torchrun and every rank inherit it.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false HF_HUB_OFFLINE=1
if ls .whl/*.whl >/dev/null 2>&1; then  # carried wheels (datasets, math-verify, ...)
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
nvidia-smi --query-gpu=index,name,memory.total --format=csv,noheader
nvidia-smi topo -m 2>/dev/null | head -3
mkdir -p bench/results
# (a) ~2.8 minutes (1-GPU runs ~17 s side by side, then each 2-GPU run ~27 s one after
#     another): no run starts after 160 s, none outlives 190 s
DANKA_EQUIV_JSON=bench/results/equivalence_2x.json DANKA_EQUIV_BUDGET_S=160 \
  timeout 195 python3 -m pytest -q -p no:cacheprovider -m gpu -rA \
  tests/distributed/test_gpu_equivalence.py 2>&1 | tail -25
equiv=${PIPESTATUS[0]}
# (b) <= 2.5 minutes (0.5B-shape model built ~25 s, each run ~45-55 s; the fast engine
#     first, then HF if time is left): runs start only within 120 s, each ends by 145 s;
#     the JSON is rewritten after every run, so a cut-off run keeps the others
timeout 150 python3 -m bench scale --only scaling --work /tmp/danka_scale \
  --budget-s 120 --out bench/results/scale_2x.json
if [ -n "${OUT:-}" ]; then
  cp bench/results/equivalence_2x.json bench/results/scale_2x.json "$OUT/" 2>/dev/null
fi
exit $equiv
