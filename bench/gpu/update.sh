#!/usr/bin/env bash
# Issue 46 on one GPU (H100 or H200): the update at the real GSM8K step's shape, padded vs
# padding-free, then the real step of both examples on Qwen2.5-Coder-0.5B-Instruct, each
# path in the same call. Run from the repository root; the GGUF travels in nine chunks as for
# bench/gpu/speed.sh (carry .carry holding cN, .whl holding gguf, data holding gsm8k).
#   bash bench/gpu/update.sh shape              # ~4 min: random weights of the Coder-0.5B shape,
#                                               # 256 sequences of GSM8K-like lengths, LoRA r32
#                                               # and full-parameter, padded vs padding-free
#   bash bench/gpu/update.sh verify             # ~8 min, no GGUF needed: .whl's wheels (datasets,
#                                               # gguf...), `pytest -m gpu tests` whole, then the
#                                               # update at the step's shape: full and LoRA, eager
#                                               # and speed.compile, LoRA through peft's forward
#   bash bench/gpu/update.sh graphs             # ~3 min, no GGUF needed: the CUDA-graph tests, then
#                                               # the update at the step's shape (random weights),
#                                               # LoRA and full-parameter, eager vs speed.cuda_graphs,
#                                               # profiled (GPU busy share, host operators)
#   bash bench/gpu/update.sh sample             # ~3 min, no GGUF needed: triton_sample's tests on
#                                               # the GPU, then the rollout at 256 x 512 (random
#                                               # Qwen2.5-0.5B shape), torch vs Triton sampling,
#                                               # each side its own process, profiled
#   bash bench/gpu/update.sh fusednorm          # ~3 min, no GGUF needed: the update at the step's
#                                               # shape, transformers' RMSNorm vs F.rms_norm
#                                               # (danka.models.fused_norm), LoRA (+graphs) and full
#   bash bench/gpu/update.sh chunk N            # N = 1..9, into /root/w
#   bash bench/gpu/update.sh steps              # ~7 min: join + convert, then the GRPO and PPO
#                                               # steps, padding-free (default) and padded
#                                               # (PATHS="default compile graphs gen512":
#                                               # speed.compile, speed.cuda_graphs, all 512 GRPO
#                                               # rows in one decode batch)
#   bash bench/gpu/update.sh lora               # ~2 min after steps: the GRPO step as shipped, its
#                                               # update rerun on the same samples as LoRA with
#                                               # larger micro-batches under checkpointing and as
#                                               # full-parameter, one call, the update profiled
#                                               # (GPU busy share: is LoRA bound by the host?)
#   bash bench/gpu/update.sh rollout            # ~3 min after steps: 256 GSM8K prompts x 512,
#                                               # EOS off/on, LoRA r32 live, fast vs HF static
#                                               # (bench/gpu/speed.sh rollout)
# JSON into bench/results/ (copies in $OUT), the log into $OUT.
set -uo pipefail
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
GGUF=${GGUF:-/root/w/qwen05.gguf}  # bench/gpu/gsm8k.sh joins it at /root/work/...
DATA=data/gsm8k/train.jsonl
quiet() { grep --line-buffered -v -i -E "warn|it/s\]$"; }
case "${1:-}" in
shape)
  nvidia-smi --query-gpu=name --format=csv,noheader
  python3 -m pytest -q -m gpu tests/models/test_varlen_gpu.py 2>&1 | tail -3
  python3 -m bench train --only update_05b --update-shape qwen2.5-coder-0.5b --update-seqs 256 \
    --update-variants "${VARIANTS:-mb8+lora+chunk128,mb8+varlen+lora+chunk128,mb16+varlen+lora+chunk128,mb16+varlen+lora+chunk1024,mb32+varlen+lora+chunk1024,mb8+chunk128,mb8+varlen+chunk128,mb16+varlen+chunk1024}" \
    --profile --profile-steps 1 --name update_shape_05b 2>&1 | quiet
  ;;
verify)
  nvidia-smi --query-gpu=name --format=csv,noheader
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:$PWD
  timeout 300 python3 -m pytest -m gpu -q -p no:logging -rfEs tests 2>&1 | tail -25
  timeout 280 python3 -m bench train --only update_05b --update-shape qwen2.5-coder-0.5b \
    --update-seqs 256 --update-variants "${VARIANTS:-mb16+varlen+chunk1024,mb16+varlen+chunk1024+compile,mb16+varlen+lora+chunk1024+peftlora,mb16+varlen+lora+chunk1024,mb16+varlen+lora+chunk1024+compile}" \
    --profile --profile-steps 1 --name update_fused_05b 2>&1 | quiet | tail -12
  ;;
graphs)
  nvidia-smi --query-gpu=name --format=csv,noheader
  timeout 120 python3 -m pytest -m gpu -q -p no:cacheprovider -rfEs \
    tests/models/test_body_graphs_gpu.py tests/models/test_varlen_gpu.py 2>&1 | tail -15
  timeout "${SHAPE_S:-300}" python3 -m bench train --only update_05b --update-shape qwen2.5-coder-0.5b \
    --update-seqs 256 --update-variants "${VARIANTS:-mb16+varlen+lora+chunk1024,mb16+varlen+lora+chunk1024+graphs,mb16+varlen+chunk1024,mb16+varlen+chunk1024+graphs}" \
    --profile --profile-steps 1 --name update_graphs_05b 2>&1 | quiet | tail -12
  ;;
fusednorm)
  nvidia-smi --query-gpu=name --format=csv,noheader
  timeout 60 python3 -m pytest -q -p no:cacheprovider tests/models/test_fused_norm.py 2>&1 | tail -2
  timeout "${SHAPE_S:-300}" python3 -m bench train --only update_05b --update-shape qwen2.5-coder-0.5b \
    --update-seqs 256 --update-variants "${VARIANTS:-mb16+varlen+lora+chunk1024,mb16+varlen+lora+chunk1024+fusednorm,mb16+varlen+lora+chunk1024+fusednorm+graphs,mb16+varlen+chunk1024,mb16+varlen+chunk1024+fusednorm}" \
    --profile --profile-steps 1 --name update_fusednorm_05b 2>&1 | quiet | tail -12
  ;;
sample)
  nvidia-smi --query-gpu=name --format=csv,noheader
  timeout 150 python3 -m pytest -q -p no:cacheprovider -rfEs tests/rollout/fast/test_triton_sample.py \
    tests/rollout/fast/test_triton_step.py 2>&1 | tail -8
  timeout 200 python3 -m bench rollout --shape qwen2-0.5b --prompts 256 --new-tokens 512 \
    --sides fast-triton,fast-triton-fusedsample --profile --name rollout_sample_ab_05b 2>&1 | quiet | tail -6
  ;;
rollout) bash bench/gpu/speed.sh rollout "$GGUF" | quiet | tail -20 ;;
lora)
  bash bench/gpu/speed.sh prep "$GGUF" 2>&1 | tail -4
  export PYTHONPATH=/tmp/site:$PWD DANKA_CACHE=$(dirname "$GGUF")/cache
  timeout "${STEP_S:-240}" python3 -m bench train --name gsm8k_step_grpo_variants --only gsm8k_step \
    --step-algos grpo --gsm8k-model "$GGUF" --gsm8k-data "$DATA" --step-steps 4 --profile \
    --profile-phases update --variants-for grpo \
    --step-variants "${VARIANTS:-base,mb32+gc,mb64+gc,full}" 2>&1 | quiet | tail -30
  ;;
chunk) bash bench/gpu/speed.sh chunk "$GGUF" "${2:?chunk number}" | tail -2 ;;
steps)
  bash bench/gpu/speed.sh prep "$GGUF" 2>&1 | tail -4
  export PYTHONPATH=/tmp/site:$PWD DANKA_CACHE=$(dirname "$GGUF")/cache
  for algo in ${ALGOS:-grpo ppo}; do
    for path in ${PATHS:-default padded}; do  # PATHS: default, padded, compile, graphs, gen512
      set_=(); [ "$path" = padded ] && set_=(--step-set speed.packed_update=false)
      [ "$path" = compile ] && set_=(--step-set speed.compile=true)
      [ "$path" = graphs ] && set_=(--step-set speed.cuda_graphs=true)
      [ "$path" = gen512 ] && set_=(--step-set rollout.generation_batch_size=512)
      name=gsm8k_step_${algo}$([ "$path" != default ] && echo "_$path")
      timeout "${STEP_S:-150}" python3 -m bench train --name "$name" --only gsm8k_step \
        --step-algos "$algo" --gsm8k-model "$GGUF" --gsm8k-data "$DATA" --step-steps 3 \
        --variants-for none "${set_[@]}" 2>&1 | quiet | tail -25
    done
  done
  ;;
*) sed -n 2,30p "$0"; exit 2 ;;
esac
[ -n "${OUT:-}" ] && cp bench/results/*update_shape* bench/results/*update_fused* bench/results/*update_graphs* \
  bench/results/gsm8k_step* "$OUT/" 2>/dev/null
ls -la bench/results | tail -5
