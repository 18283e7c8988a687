#!/usr/bin/env bash
# Speed and memory where users feel them: the real GSM8K step on Qwen2.5-Coder-0.5B-Instruct,
# on one H200. Run from the repository root, the GGUF already on the machine (its chunks
# travel as for bench/gpu/gsm8k.sh: `bash bench/gpu/speed.sh chunk GGUF N`, one call each, then
# the first `prep`/`all` joins and checks them); carry .whl (gguf) and .whl_trl (TRL 1.16.0 +
# datasets, dill, multiprocess) and data (data/gsm8k/*.jsonl).
#   bash bench/gpu/speed.sh chunk GGUF N      # N = 1..9: .carry/cN -> GGUF's folder
#   bash bench/gpu/speed.sh prep GGUF         # join + sha256 if needed, wheels, convert once
#                                             # (~1-2 min when not converted yet)
#   bash bench/gpu/speed.sh all GGUF          # items 1-5 below, ~9 min (DEADLINE=560 s)
#   bash bench/gpu/speed.sh trl GGUF          # TRL vs danka at the GSM8K settings, LoRA + full,
#                                             # TRL_PROMPTS x 8 (default 16), then the step
#                                             # variants `all` leaves out; ~8 min
#   bash bench/gpu/speed.sh tests GGUF        # the plan-vs-measured GPU test matrix (~6 min)
#   bash bench/gpu/speed.sh rollout GGUF      # item 3 below alone (~3 min)
# `all`, in order (expected seconds on a solo H200; each capped, none started without the
# time it needs before DEADLINE, item 5's share kept):
#   1. where the real step's time goes: GRPO (64 x 8 x <= 512) then PPO (256 x 1) of
#      examples/gsm8k_*.yaml, 1 warm-up + 2 timed steps, the last profiled per phase; GRPO
#      variants base, mb16, mb32, chunk1024 on one mini-batch                (~145 + ~105 s)
#   2. the update's MFU at 0.5B, LoRA and full-parameter, real weights, 16 x 512 tokens;
#      the log-prob head at 8 x 512 and 8 x 1024 response tokens                      (~45 s)
#   3. rollout at the real shape: 256 GSM8K prompts x <= 512 new tokens, EOS off and on,
#      LoRA r32 live (lora_compute auto) vs HF static cache, each side fresh; profile (~100 s)
#   4. TRL vs danka, GSM8K settings, 8 x 8, LoRA, 3 steps: only when time is left (the
#      real comparison is `trl`)                                                     (~140 s)
#   5. memory plan vs measured: the seed's single_card_ppo.yaml verbatim at the Qwen2-7B
#      shape (micro-batch auto under 24 GiB, and 4 uncapped), the 7B bench config
#      (small-card), the 0.5B GSM8K configs from item 1; runs in parallel        (~120 s)
# Left out of `all` to fit (run by `trl`): variants chunk512, mb16+gc, mb32+gc, full, full+mb16
# (item 2 has the full-parameter update on 16 x 512). Expected: ~15 s prep, then 145, 105, 45,
# 100, (4 skipped), 120: ~530 s.
# Writes JSON to bench/results/ (copies in $OUT) and the log to $OUT/gpu_speed_<part>.log.
set -uo pipefail
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
PART=${1:-}
SHA=1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32
DATA=data/gsm8k/train.jsonl
R=bench/results
DEADLINE=${DEADLINE:-560}
mkdir -p "$R"
[ -n "${OUT:-}" ] && mkdir -p "$OUT"
t0=$(date +%s)
elapsed() { echo $(( $(date +%s) - t0 )); }
stamp() { echo "== $1 ($(elapsed) s)"; }

usage() { sed -n 2,33p "$0"; exit 2; }
[ $# -ge 2 ] || usage
GGUF=$2
W=$(dirname "$GGUF")
export DANKA_CACHE=${DANKA_CACHE:-$W/cache}

# item NAME CAP RESERVE CMD...: run CMD with a timeout of CAP seconds, cut to what is left
# before DEADLINE after RESERVE seconds kept for the later items (their expected seconds);
# skipped under 30 s. Every bench writes its JSON as it goes: a cut item keeps what it got.
item() {
  local name=$1 cap=$2 reserve=$3; shift 3
  [[ -n "${ONLY:-}" && "$name" != "$ONLY"* ]] && return 0  # `rollout`: item 3 alone
  local left=$(( DEADLINE - $(elapsed) - reserve ))
  local t=$(( cap < left ? cap : left ))
  if [ "$t" -lt 30 ]; then
    echo "== $name: SKIPPED ($(elapsed) s elapsed, ${left} s left of DEADLINE=$DEADLINE after a ${reserve} s reserve)"
    return 0
  fi
  local s=$(date +%s)
  stamp "$name (cap $t s)"
  timeout "$t" "$@" 2>&1 | grep --line-buffered -v -E "Warning|warnings.warn|it/s\]$"
  local rc=${PIPESTATUS[0]}
  echo "== $name: rc $rc$([ "$rc" = 124 ] && echo ' (timed out)'), $(( $(date +%s) - s )) s"
}

join_gguf() {  # the nine chunks of bench/gpu/gsm8k.sh / `chunk N`, joined once and checked
  [ -f "$GGUF" ] && return 0
  cat "$W"/c{1,2,3,4,5,6,7,8,9} > "$GGUF" && echo "$SHA  $GGUF" | sha256sum -c || exit 1
  rm -f "$W"/c?
}

wheels() {  # .whl (gguf ...) and .whl_trl (trl, datasets, dill, multiprocess), one copy each
  python3 -c "import gguf, trl, datasets" 2>/dev/null && return 0
  local list=() seen=" "
  for f in .whl_trl/*.whl .whl/*.whl; do
    [ -f "$f" ] || continue
    local b; b=$(basename "$f" | cut -d- -f1)
    [[ "$seen" == *" $b "* ]] && continue
    seen+="$b "; list+=("$f")
  done
  [ ${#list[@]} -gt 0 ] && python3 -m pip install -q --no-index --no-deps --no-compile \
      --no-cache-dir --upgrade --target /tmp/site "${list[@]}"
  export PYTHONPATH=/tmp/site:$PWD
}

prep() {
  join_gguf
  [ -d /tmp/site ] && export PYTHONPATH=/tmp/site:$PWD
  wheels
  nvidia-smi --query-gpu=name,memory.used,memory.total,driver_version --format=csv
  nvidia-smi --query-compute-apps=pid,used_memory --format=csv,noheader | sed 's/^/busy: /'
  python3 -c "import torch, transformers, peft; print(torch.__version__, transformers.__version__, peft.__version__)"
  [ -f "$DATA" ] || { echo "no $DATA: carry data (data/gsm8k/*.jsonl)"; exit 1; }
  local s=$(date +%s)
  python3 -c "from danka.models.gguf import ensure_converted; print(ensure_converted('$GGUF'))" || exit 1
  echo "converted folder ready ($(( $(date +%s) - s )) s)"
}

part_all() {
  prep
  item "1a. gsm8k_step GRPO" 180 370 python3 -m bench train --name gsm8k_step_grpo \
    --only gsm8k_step --step-algos grpo --gsm8k-model "$GGUF" --gsm8k-data "$DATA" --profile \
    --step-variants base,mb16,mb32,chunk1024 --variants-budget-s 40
  item "1b. gsm8k_step PPO" 130 265 python3 -m bench train --name gsm8k_step_ppo \
    --only gsm8k_step --step-algos ppo --gsm8k-model "$GGUF" --gsm8k-data "$DATA" --profile
  item "2. update MFU + log-prob head" 70 220 python3 -m bench train --name update_05b_real \
    --only update_05b,logprob_memory --gsm8k-model "$GGUF" \
    --update-variants mb16+lora,mb16 --head-responses 512,1024 --profile --profile-steps 2
  item "3. rollout 256 x 512" 160 120 python3 -m bench rollout --timeout 110 \
    --name rollout_qwen05_gsm8k_256x512 --model "$GGUF" --prompts-from "$DATA" --prompts 256 \
    --new-tokens 512 --eos both --lora --lora-modes auto --lora-rank 32 \
    --sides fast-default,hf-static --check-rows 16 --profile
  item "4. TRL vs danka (small)" 150 140 python3 -m bench trl --name trl_qwen05_gsm8k_8x8_lora \
    --model "$GGUF" --task gsm8k --gsm8k-data "$DATA" --variants lora --prompts 8 \
    --generations 8 --new-tokens 512 --micro 8 --steps 3 --timeout 140
  item "5. plan vs measured" 170 0 python3 -m bench plan-check --gguf "$GGUF" \
    --gsm8k-data "$DATA" --from-step-json "$R/gsm8k_step_grpo.json,$R/gsm8k_step_ppo.json" \
    --configs seed,seed-mb4,small-card,qwen05-grpo,qwen05-ppo --parallel --timeout 120
}

part_trl() {
  prep
  # expected at 16 x 8 (TRL_PROMPTS): TRL ~90 s + danka ~70 s a variant (TRL's HF generate
  # runs until the longest answer ends: ~15 s a rollout here); 32 x 8 ~150 + 90 s, the
  # example's 64 x 8 ~250 + 110 s (then one variant a call: TRL_PROMPTS=64 TRL_SIDE_S=300
  # TRL_VARIANTS=lora, then =full).
  # Each side is capped at TRL_SIDE_S (180 s): one over it is recorded as timed out and
  # the other side still runs; the JSON names the batch that was used.
  local p=${TRL_PROMPTS:-16} side=${TRL_SIDE_S:-180} variants=(${TRL_VARIANTS:-lora full})
  local i
  for i in "${!variants[@]}"; do
    local v=${variants[$i]} later=$(( ${#variants[@]} - i - 1 ))
    item "4. TRL vs danka ${p} x 8, ${v}" $(( 2 * side + 30 )) $(( 130 + 170 * later )) \
      python3 -m bench trl --name "trl_qwen05_gsm8k_${p}x8_${v}" --model "$GGUF" --task gsm8k \
      --gsm8k-data "$DATA" --variants "$v" --prompts "$p" --generations 8 --new-tokens 512 \
      --micro 8 --steps 3 --timeout "$side"
  done
  item "1c. GRPO variants left out of all" 200 0 python3 -m bench train \
    --name gsm8k_step_grpo_more --only gsm8k_step --step-algos grpo --step-steps 1 \
    --gsm8k-model "$GGUF" --gsm8k-data "$DATA" \
    --step-variants base,chunk512,mb16+gc,mb32+gc,full,full+mb16 --variants-budget-s 120
}

part_tests() {
  prep
  export DANKA_BENCH_GGUF=$GGUF DANKA_BENCH_DATA=$DATA
  item "plan-vs-measured GPU tests" 540 0 python3 -m pytest -m gpu -q \
    -p no:cacheprovider -rs tests/bench/memory/test_plan_gpu.py --junitxml="${OUT:-/tmp}/plan_gpu_tests.xml"
}

log=${OUT:-/tmp}/gpu_speed_${PART}.log
case "$PART" in
  chunk) mkdir -p "$W" && cp ".carry/c${3:?chunk number}" "$W/" && ls -la "$W" ;;
  prep) prep 2>&1 | tee "$log" ;;
  all) part_all 2>&1 | tee "$log" ;;
  trl) part_trl 2>&1 | tee "$log" ;;
  tests) part_tests 2>&1 | tee "$log" ;;
  rollout) ONLY=3 part_all 2>&1 | tee "$log" ;;
  *) usage ;;
esac
stamp "done"
ls -la "$R" | tail -12
