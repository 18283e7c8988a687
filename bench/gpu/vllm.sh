#!/usr/bin/env bash
# vLLM vs danka's fast engine on one H200 reached through 64 MiB calls: the vLLM wheel parts
# (scripts/vllm_wheels.sh: p1..p6 + SHA256SUMS) and the Qwen2.5-Coder-0.5B GGUF (nine
# chunks) travel one file a call; vLLM's GPU tests run in the background while the GGUF
# arrives; then `python -m bench vllm` runs in the background and later calls wait for it.
# Everything lives under /root/work (the checkout is copied there once).
#
# Here, once:  bash scripts/vllm_wheels.sh /work/vllm_wheels
#              bash ../shared/tools/qwen05.sh /work/qwen --split          (chunks c1..c9)
#              mkdir -p .carry && cp /work/vllm_wheels/SHA256SUMS .carry/
# Calls (each carries .carry holding just that call's file; the first also .whl):
#   bash bench/gpu/vllm.sh begin           # danka's wheels (.whl), the checkout, SHA256SUMS + p1
#   bash bench/gpu/vllm.sh put FILE        # FILE = p2 .. p6, then c1 .. c9
#   bash bench/gpu/vllm.sh install [C [T]] # after p6: check, join, install vLLM into
#                                          # /tmp/vllm_site, load its kernels, start the GPU tests
#                                          # (T: the pytest paths, default tests; C: a GGUF chunk)
#   bash bench/gpu/vllm.sh bench [ARGS]    # after c9: join + sha256, convert once, wait for the
#                                          # tests, start `python -m bench vllm --model GGUF ARGS`
#   bash bench/gpu/vllm.sh queue [ITEM..]  # after c9, instead of `bench`: join, convert, then in
#                                          # the background, once the suite is done, the timed
#                                          # runs of QUEUE below (ITEMs of $QUEUE_ALL, default all)
#   bash bench/gpu/vllm.sh wait SECONDS    # wait for the tests / the bench, show progress; the
#                                          # results so far come back as a tar.gz in $OUT
#   bash bench/gpu/vllm.sh collect         # results + logs as one tar.gz in $OUT
set -uo pipefail
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false VLLM_ENABLE_V1_MULTIPROCESSING=0
W=/root/work
SHA=1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32
GGUF=$W/qwen2.5-coder-0.5b-instruct.gguf
case "${1:-}" in begin|put|install|bench|queue|run-queue|wait|collect) mkdir -p "$W/in" "$W/results" "$W/logs" ;; esac
QUEUE_ALL="rollout64 rollout256 plan_tests grpo_lora grpo_full"
want() { [[ " ${QUEUE:-$QUEUE_ALL} " == *" $1 "* ]]; }  # is item $1 in the queue
site() { export PYTHONPATH=/tmp/site:/tmp/vllm_site DANKA_CACHE=$W/cache; }
# the GPU tests `install` started: wait until they are done
wait_for_suite() { while pgrep -f "[p]ytest -m gpu" > /dev/null; do sleep 2; done; }
source "$(dirname "$0")/common.sh"

case "${1:-}" in
begin)
  nvidia-smi --query-gpu=name,memory.used,memory.total,driver_version --format=csv
  ldd --version | head -1  # llguidance's wheel needs glibc 2.31, cryptography's 2.34
  if ls .whl/*.whl > /dev/null 2>&1; then  # gguf, datasets, dill, multiprocess, trl
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
  fi
  rm -rf "$W/repo" && mkdir -p "$W/repo" && cp -a . "$W/repo/" && rm -rf "$W/repo/.carry"
  cp .carry/* "$W/in/" && ls -la "$W/in"
  ;;
put)
  cp ".carry/$2" "$W/in/" && ls "$W/in" | tr '\n' ' ' && echo
  tail -c 300 "$W/logs/gpu_tests.log" 2>/dev/null; true
  ;;
install)
  [ -n "${2:-}" ] && cp ".carry/$2" "$W/in/"  # the first GGUF chunk, in the same call
  cd "$W/repo" && bash scripts/vllm_install_parts.sh "$W/in" /tmp/vllm_site || exit 1
  rm -f "$W"/in/p[0-9]*
  site
  python3 -c "import numba, numpy; print('numba', numba.__version__, 'numpy', numpy.__version__)"
  # the GPU tests ($3; default the whole suite, vLLM's tests included; the plan matrix
  # skips here without the GGUF: `queue` runs it)
  setsid bash -c "timeout 1200 python3 -m pytest -m gpu -q -p no:cacheprovider -rs \
      ${3:-tests} --junitxml=$W/results/gpu_tests.xml \
      > $W/logs/gpu_tests.log 2>&1; echo exit \$? >> $W/logs/gpu_tests.log" \
      < /dev/null > /dev/null 2>&1 &
  echo "GPU tests started: ${3:-tests}"
  ;;
queue)
  [ -f "$GGUF" ] || { cat "$W"/in/c{1,2,3,4,5,6,7,8,9} > "$GGUF" && echo "$SHA  $GGUF" | sha256sum -c || exit 1; }
  rm -f "$W"/in/c?
  cd "$W/repo" && site
  python3 -c "from danka.models.gguf import ensure_converted; ensure_converted('$GGUF')" || exit 1
  touch "$W/results/.since"
  shift; export QUEUE="${*:-$QUEUE_ALL}"
  setsid bash -c "bash bench/gpu/vllm.sh run-queue > $W/logs/queue.log 2>&1" < /dev/null > /dev/null 2>&1 &
  echo "queue started"
  ;;
run-queue)
  # QUEUE, each item capped and run with the GPU to itself; issue 38's measurements, all
  # done once (bench/results/INDEX.md: H200 2026-12-03, H100 2026-12-06), to run again.
  cd "$W/repo" && site
  R=$W/results D=$W/repo/data/gsm8k/train.jsonl
  # the suite first, alone: vLLM's start-up refuses to size its KV cache while another
  # process frees GPU memory ("Error in memory profiling", 2026-12-03, second session)
  wait_for_suite
  q() { local cap=$1 name=$2; shift 2; local s=$(date +%s); echo "== $name (cap $cap s) $(date +%T)"
        timeout "$cap" "$@" > "$W/logs/q_$name.log" 2>&1
        echo "== $name: rc $? $(( $(date +%s) - s )) s"; }
  grpo_step() {  # NAME CAP SIDE_TIMEOUT [--grpo-set K=V ...]: both engines, their defaults
    local name=$1 cap=$2 side=$3; shift 3  # (vLLM asleep through the update)
    q "$cap" "$name" python3 -m bench vllm --model "$GGUF" --only grpo --grpo-engines vllm,fast \
        --grpo-steps 3 --data $D --name "vllm_default_qwen05_$name" --timeout "$side" \
        --out-dir $R "$@"; }
  # 1. the 64-sequence cells, then the vLLM LoRA adapter side at 256 (fast LoRA beside it)
  want rollout64 && q 330 rollout64 python3 -m bench rollout --name vllm_vs_fast_qwen05_gsm8k_64x512 --model "$GGUF" \
      --prompts-from $D --prompts 64 --new-tokens 512 --eos both --lora --lora-modes auto \
      --lora-rank 32 --sides vllm,fast-default,hf-static --timeout 150 --out-dir $R
  want rollout256 && q 330 rollout256 python3 -m bench rollout --name vllm_lora_qwen05_gsm8k_256x512 --model "$GGUF" \
      --prompts-from $D --prompts 256 --new-tokens 512 --eos both --lora --lora-modes auto \
      --lora-rank 32 --sides vllm-lora-adapter,fast-default --timeout 160 --out-dir $R
  # 2. the plan tests (they need the GGUF)
  want plan_tests && q 420 plan_tests env DANKA_BENCH_GGUF=$GGUF DANKA_BENCH_DATA=$D python3 -m pytest -m gpu -q \
      -p no:cacheprovider -rs tests/bench/memory/test_plan_gpu.py --junitxml=$R/plan_gpu_tests.xml
  # 3. the GSM8K example's step with both engines' defaults, 3 steps an engine (2 timed)
  want grpo_lora && grpo_step grpo_lora 480 230
  want grpo_full && grpo_step grpo_full 440 210 --grpo-set lora.enable_lora=false --grpo-set optim.lr=1e-6
  echo "== queue done $(date +%T)"
  ;;
bench)
  shift
  cat "$W"/in/c{1,2,3,4,5,6,7,8,9} > "$GGUF" && echo "$SHA  $GGUF" | sha256sum -c || exit 1
  rm -f "$W"/in/c?
  cd "$W/repo" && site
  python3 -c "from danka.models.gguf import ensure_converted; ensure_converted('$GGUF')" || exit 1
  wait_for_suite  # no GPU sharing while timing
  tail -5 "$W/logs/gpu_tests.log"
  setsid bash -c "python3 -m bench vllm --model $GGUF --out-dir $W/results $* \
      > $W/logs/bench_vllm.log 2>&1; echo exit \$? >> $W/logs/bench_vllm.log" \
      < /dev/null > /dev/null 2>&1 &
  echo "started: python -m bench vllm --model $GGUF $*"
  ;;
wait)
  wait_for_jobs "$2" "bench vllm|bench |pytest|run-queue" 6 -vE "^\s*$|Warning|warn\("
  # what is done so far comes back with every wait: a machine taken back loses nothing
  cd "$W" && tar czf "$OUT/vllm_session.tar.gz" --exclude='_*' results logs 2>/dev/null
  ;;
collect)
  cd "$W" && tar czf "$OUT/vllm_session.tar.gz" --exclude='_*' results logs 2>/dev/null
  ls -la "$OUT"
  ;;
*)
  sed -n 2,20p "$0"; exit 2 ;;
esac
