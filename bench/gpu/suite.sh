#!/usr/bin/env bash
# danka's GPU suite for one H200. Run from the repository root:
#   bash bench/gpu/suite.sh rollout   # GPU tests + rollout benchmarks       (~5 min, cap 560 s)
#   bash bench/gpu/suite.sh train     # update path (+profile), 7B PPO memory (HF, fast,
#                                     # QLoRA; vs danka estimate), packing, rollout profile
#                                     # (~5.5 min, caps add up to 550 s; SKIP=qlora,... skips)
#   bash bench/gpu/suite.sh all       # both (~9 min: more than one 10-minute device call allows)
# Writes JSON to bench/results/ and copies it to $OUT. Needs only the repository and the
# machine's torch/transformers/peft (no wheels); .whl/*.whl, if present, go to /tmp/site.
set -uo pipefail
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
PART=${1:-rollout}
mkdir -p bench/results
[ -n "${OUT:-}" ] && mkdir -p "$OUT"
if compgen -G ".whl/*.whl" > /dev/null; then
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:.
fi
t0=$(date +%s)
stamp() { echo "== $1 ($(( $(date +%s) - t0 )) s)"; }

stamp "environment"
nvidia-smi --query-gpu=name,memory.used,memory.total,driver_version --format=csv
python3 -c "import torch, transformers, peft; print(torch.__version__, transformers.__version__, peft.__version__)"

rollout_part() {
  # GPU tests: cuDNN SDPA's NaN gradients on padded rows and the fix, the bf16 log-prob
  # head without an fp32 copy, unmerged LoRA in the fast engine under CUDA graphs, the tiny
  # trainer on the GPU (engines + update together). ~2 min.
  stamp "GPU tests"
  timeout 180 python3 -m pytest -m gpu -q -p no:cacheprovider -rs \
    tests/models/test_attention_backends.py tests/models/test_chunked_logprobs.py tests/rollout \
    tests/trainer/test_train_gpu.py \
    --junitxml="${OUT:-/tmp}/gpu_tests.xml" 2>&1 | tail -25
  # SmolLM2-135M shape (random weights), 64 x 256: fast (plain + LoRA live), HF dynamic
  # cache, HF static cache + torch.compile (~45 s first call); each side a fresh process.
  stamp "rollout smollm2-135m 64x256"
  timeout 200 python3 -m bench rollout --timeout 150 --shape smollm2-135m \
    --prompts 64 --new-tokens 256 --lora 2>&1 | tail -8
  # Qwen2.5-0.5B shape, 64 x 256: fast (LoRA live) and HF dynamic. ~1 min.
  stamp "rollout qwen2-0.5b 64x256"
  timeout 120 python3 -m bench rollout --timeout 100 --shape qwen2-0.5b \
    --prompts 64 --new-tokens 256 --lora --sides fast,hf-dynamic 2>&1 | tail -6
  # SmolLM2 shape, 256 x 256: fast only. ~20 s.
  stamp "rollout smollm2-135m 256x256"
  timeout 60 python3 -m bench rollout --timeout 55 --shape smollm2-135m \
    --prompts 256 --new-tokens 256 --lora --sides fast 2>&1 | tail -4
}

train_part() {
  # Each step is skippable: SKIP=qlora,packing bash bench/gpu/suite.sh train
  # (names: update ppo qlora packing rprofile). Caps add up to 550 s; expected ~5.5 min.
  skip() { [[ ",${SKIP:-}," == *",$1,"* ]]; }
  # Chunked bf16 log-prob head vs full logits; 0.5B-shape full update (16 x 512 tokens,
  # micro 16, with/without checkpointing): tok/s, MFU, peak; --profile: top 15 CUDA kernels
  # of 3 more steps per variant. Sections measured 14 s + start ~20 s + profile ~10 s.
  skip update || { stamp "train: logprob_memory, update_05b (+profile)"
    timeout 100 python3 -m bench train --only logprob_memory,update_05b \
      --update-variants mb16,mb16+gc --profile 2>&1 | tail -4; }
  # Whole PPO step on the Qwen2-7B shape, HF and fast engine: peak GiB per phase and
  # danka estimate's prediction + error per engine. Section measured 29 s + start ~25 s.
  skip ppo || { stamp "train: ppo_7b hf,fast"
    timeout 110 python3 -m bench train --name train_ppo_7b --only ppo_7b \
      --ppo-engines hf,fast 2>&1 | tail -4; }
  # Same step with QLoRA: random 7B written as bf16 safetensors to /dev/shm (~15 GB,
  # ~30-60 s; the temp dir when /dev/shm is small), loaded as NF4 through
  # model.load_in_4bit (~30-60 s), 2 PPO steps with HF generate (~30 s); + estimate.
  skip qlora || { stamp "train: ppo_7b hf-qlora"
    timeout 190 python3 -m bench train --name train_ppo_7b_qlora \
      --only ppo_7b --ppo-engines hf-qlora 2>&1 | tail -4; }
  # GRPO update, speed.packing on vs off, GSM8K-like lengths (prompt 100-200, response
  # 50-300, 8 x 8), SmolLM2-135M and 0.5B shapes, micro 8/16/64. ~40 s + start.
  skip packing || { stamp "train: packing_step"
    timeout 90 python3 -m bench train --only packing_step 2>&1 | tail -4; }
  # Fast-engine rollout with a live LoRA, SmolLM2 shape 64 x 256, top CUDA kernels per
  # call (plain / LoRA fp32 / LoRA folded). ~30 s.
  skip rprofile || { stamp "rollout profile smollm2-135m 64x256 fast"
    timeout 60 python3 -m bench rollout --timeout 55 --name rollout_smollm2-135m_64x256_profile \
      --shape smollm2-135m --prompts 64 --new-tokens 256 --lora --sides fast \
      --profile 2>&1 | tail -3; }
}

case "$PART" in
  rollout) rollout_part ;;
  train) train_part ;;
  all) rollout_part; train_part ;;
  *) echo "usage: bash bench/gpu/suite.sh rollout|train|all"; exit 2 ;;
esac
stamp "done"
ls -la bench/results
