#!/usr/bin/env bash
# GSM8K on the real Qwen2.5-Coder-0.5B-Instruct, on one H200 reached through 64 MiB calls:
# the GGUF (491 MB) travels in nine chunks, one call each, while the whole GPU test suite
# runs in the background; then the learning runs start in the background and later calls
# wait for them. Everything lives under /root/work (the checkout is copied there once, so
# later calls that re-send the checkout do not touch a running job).
#
# Here, once:  bash ../shared/tools/qwen05.sh /work/qwen --split   (chunks c1..c9)
#              mkdir -p .carry data/gsm8k && cp ../shared/data/gsm8k/*.jsonl data/gsm8k/
# Calls (each carries .carry holding just that call's chunk; the first also .whl, the ninth
# data: chunk 1, .whl and data together pass the 64 MiB a call carries):
#   bash bench/gpu/gsm8k.sh begin          # wheels, chunk 1; `pytest -m gpu tests` starts
#   bash bench/gpu/gsm8k.sh chunk N        # N = 2..9 (data/gsm8k, when carried, joins the copy)
#   bash bench/gpu/gsm8k.sh runs MINUTES NAME:CONFIG[:key=value,...] ...
#                                          # join + sha256, convert once, start the runs
#   bash bench/gpu/gsm8k.sh trl MINUTES    # the peer (carry .whl_trl): TRL's GRPOTrainer learns
#                                          # the same job for MINUTES (`python -m bench trl-learn`)
#   bash bench/gpu/gsm8k.sh wait SECONDS   # wait for the runs (at most SECONDS), show progress
#   bash bench/gpu/gsm8k.sh collect        # results + logs as one tar.gz in $OUT
set -uo pipefail
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
W=/root/work
SHA=1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32
GGUF=$W/qwen2.5-coder-0.5b-instruct.gguf
mkdir -p "$W/results" "$W/logs"
site() { export PYTHONPATH=/tmp/site; }
source "$(dirname "$0")/common.sh"

case "${1:-}" in
begin)
  nvidia-smi --query-gpu=name,memory.used,memory.total,driver_version --format=csv
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
  rm -rf "$W/repo" && mkdir -p "$W/repo" && cp -a . "$W/repo/" && rm -rf "$W/repo/.carry"
  cp .carry/c1 "$W/" && ls -la "$W"
  cd "$W/repo" && site
  python3 -c "import torch, transformers, peft, gguf; print(torch.__version__, transformers.__version__, peft.__version__, gguf.__name__)"
  setsid bash -c "timeout 1200 python3 -m pytest -m gpu -q -p no:cacheprovider -rs tests \
      --junitxml=$W/results/gpu_tests.xml > $W/logs/gpu_tests.log 2>&1; echo exit \$? >> $W/logs/gpu_tests.log" \
      < /dev/null > /dev/null 2>&1 &
  echo "GPU tests started"
  ;;
chunk)
  cp ".carry/c$2" "$W/" && ls -la "$W" | grep -c ' c[0-9]$'
  [ -d data/gsm8k ] && mkdir -p "$W/repo/data" && cp -r data/gsm8k "$W/repo/data/"
  tail -c 600 "$W/logs/gpu_tests.log" 2>/dev/null
  ;;
runs)
  minutes=$2; shift 2
  if [ ! -f "$GGUF" ]; then  # joined already by `GGUF=... update.sh steps`
    cat "$W"/c{1,2,3,4,5,6,7,8,9} > "$GGUF" && echo "$SHA  $GGUF" | sha256sum -c || exit 1
    rm -f "$W"/c?
  fi
  cd "$W/repo" && site
  export DANKA_CACHE=$W/cache
  python3 -c "from danka.models.gguf import ensure_converted; ensure_converted('$GGUF')" || exit 1
  for spec in "$@"; do
    IFS=: read -r name config extra <<< "$spec"
    overrides=()
    [ -n "$extra" ] && IFS=, read -r -a overrides <<< "$extra"
    setsid bash -c "python3 -m bench gsm8k $config --model $GGUF --minutes $minutes \
        --out $W/results/$name.json --output-dir $W/runs/$name ${overrides[*]} \
        > $W/logs/$name.log 2>&1; echo exit \$? >> $W/logs/$name.log" < /dev/null > /dev/null 2>&1 &
    echo "started $name: $config ${overrides[*]}"
  done
  ;;
trl)
  site  # /tmp/site first: TRL installed by an earlier call is found there
  python3 -c "import trl" 2>/dev/null ||
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl_trl/*.whl
  cd "$W/repo" && export DANKA_CACHE=$W/cache
  setsid bash -c "python3 -m bench trl-learn --model $GGUF --minutes $2 \
      --out $W/results/gsm8k_qwen05_trl.json --work $W/runs/trl_learn \
      --beside bench/results/gsm8k_qwen05_grpo.json > $W/logs/trl_learn.log 2>&1; \
      echo exit \$? >> $W/logs/trl_learn.log" < /dev/null > /dev/null 2>&1 &
  echo "started trl-learn for $2 minutes"
  ;;
wait)
  wait_for_jobs "$2" "bench (gsm8k|trl-learn)" 6 -E "held-out|step [0-9]+ \||exit|goals|Error|error"
  ;;
collect)
  # the runs' logs, metrics, evaluations and completions; not their checkpoints (~1 GB)
  cd "$W" && tar czf "$OUT/gsm8k_session.tar.gz" results logs runs/*/eval runs/*/logs \
      runs/*/metrics.jsonl runs/*/config.json runs/*/*.json runs/*/completions 2>/dev/null
  ls -la "$OUT"
  ;;
*)
  sed -n 2,16p "$0"; exit 2 ;;
esac
