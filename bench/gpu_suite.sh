#!/usr/bin/env bash
# danka's GPU suite (H200, ~6 min): GPU-marked tests of the rollout engines and the attention
# setting, then the rollout benchmark with every side in its own fresh process.
# Run from the repository root: bash bench/gpu_suite.sh   (writes to $OUT and bench/results)
# Needs only the repository and the machine's torch/transformers/peft; .whl/*.whl (if any)
# are installed into /tmp/site first.
set -uo pipefail
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
OUT=${OUT:-bench/results}
mkdir -p "$OUT" bench/results
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:.
fi
t0=$(date +%s)
stamp() { echo "== $1 ($(( $(date +%s) - t0 )) s)"; }

stamp "environment"
nvidia-smi --query-gpu=name,memory.used,memory.total,driver_version --format=csv | tee "$OUT/nvidia_smi.txt"
python3 -c "import torch, transformers, peft; print(torch.__version__, transformers.__version__, peft.__version__)"

# 1. GPU tests: cuDNN SDPA NaN repro + fix (issue 11 #1), unmerged LoRA in the fast engine
#    (issue 11 #2), CUDA-graph replay. ~1.5 min.
stamp "GPU tests"
timeout 180 python3 -m pytest -m gpu -q -p no:cacheprovider -rs \
  tests/models/test_attention_backends.py tests/models/test_chunked_logprobs.py tests/rollout \
  --junitxml="$OUT/gpu_tests.xml" 2>&1 | tail -25

# 2. Rollout, SmolLM2-135M shape (random weights), 64 x 256: fast (plain and LoRA live),
#    HF dynamic cache, HF static cache + torch.compile; each side a fresh process. ~2 min.
stamp "rollout smollm2-135m 64x256"
timeout 240 python3 bench/run.py --timeout 200 rollout --shape smollm2-135m \
  --prompts 64 --new-tokens 256 --lora 2>&1 | tail -8

# 3. Rollout, Qwen2.5-0.5B shape, 64 x 256: fast (LoRA live) and HF dynamic. ~1 min.
stamp "rollout qwen2-0.5b 64x256"
timeout 150 python3 bench/run.py --timeout 120 rollout --shape qwen2-0.5b \
  --prompts 64 --new-tokens 256 --lora --sides fast,hf-dynamic 2>&1 | tail -6

# 4. Rollout, SmolLM2 shape, 256 x 256: fast only (engine scaling). ~20 s.
stamp "rollout smollm2-135m 256x256"
timeout 90 python3 bench/run.py --timeout 80 rollout --shape smollm2-135m \
  --prompts 256 --new-tokens 256 --lora --sides fast 2>&1 | tail -4

# 5. Update path: chunked bf16 log-prob head vs full logits, and the 0.5B-shape full update
#    (16 x 512 tokens, micro 16, with/without checkpointing): tok/s, MFU, peak. ~1 min.
stamp "train: logprob_memory, update_05b"
timeout 200 python3 bench/run.py --timeout 180 train --only logprob_memory,update_05b \
  --update-variants mb16,mb16+gc 2>&1 | tail -4

stamp "done"
ls -la "$OUT"
