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
#   bash bench/gpu_vllm.sh begin           # danka's wheels (.whl), the checkout, SHA256SUMS + p1
#   bash bench/gpu_vllm.sh put FILE        # FILE = p2 .. p6, then c1 .. c9
#   bash bench/gpu_vllm.sh install         # after p6: check, join, install vLLM into
#                                          # /tmp/vllm_site, load its kernels, start the GPU tests
#   bash bench/gpu_vllm.sh bench [ARGS]    # after c9: join + sha256, convert once, wait for the
#                                          # tests, start `python -m bench vllm --model GGUF ARGS`
#   bash bench/gpu_vllm.sh wait SECONDS    # wait for the tests / the bench, show progress
#   bash bench/gpu_vllm.sh collect         # results + logs as one tar.gz in $OUT
set -uo pipefail
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false VLLM_ENABLE_V1_MULTIPROCESSING=0
W=/root/work
SHA=1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32
GGUF=$W/qwen2.5-coder-0.5b-instruct.gguf
case "${1:-}" in begin|put|install|bench|wait|collect) mkdir -p "$W/in" "$W/results" "$W/logs" ;; esac
site() { export PYTHONPATH=/tmp/site:/tmp/vllm_site DANKA_CACHE=$W/cache; }
source "$(dirname "$0")/gpu_common.sh"

case "${1:-}" in
begin)
  nvidia-smi --query-gpu=name,memory.used,memory.total,driver_version --format=csv
  ldd --version | head -1  # llguidance's wheel needs glibc 2.31, cryptography's 2.34
  if ls .whl/*.whl > /dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl || exit 1
  fi
  rm -rf "$W/repo" && mkdir -p "$W/repo" && cp -a . "$W/repo/" && rm -rf "$W/repo/.carry"
  cp .carry/* "$W/in/" && ls -la "$W/in"
  ;;
put)
  cp ".carry/$2" "$W/in/" && ls "$W/in" | tr '\n' ' ' && echo
  tail -c 600 "$W/logs/vllm_gpu_tests.log" 2>/dev/null
  ;;
install)
  cd "$W/repo" && bash scripts/vllm_install_parts.sh "$W/in" /tmp/vllm_site || exit 1
  rm -f "$W"/in/p[0-9]*
  site
  python3 -c "import numba, numpy; print('numba', numba.__version__, 'numpy', numpy.__version__)"
  setsid bash -c "timeout 1200 python3 -m pytest -m gpu -q -p no:cacheprovider -rs \
      tests/rollout/test_vllm_gpu.py --junitxml=$W/results/vllm_gpu_tests.xml \
      > $W/logs/vllm_gpu_tests.log 2>&1; echo exit \$? >> $W/logs/vllm_gpu_tests.log" \
      < /dev/null > /dev/null 2>&1 &
  echo "vLLM GPU tests started"
  ;;
bench)
  shift
  cat "$W"/in/c{1,2,3,4,5,6,7,8,9} > "$GGUF" && echo "$SHA  $GGUF" | sha256sum -c || exit 1
  rm -f "$W"/in/c?
  cd "$W/repo" && site
  python3 -c "from danka.models.gguf import ensure_converted; ensure_converted('$GGUF')" || exit 1
  while pgrep -f "test_vllm_gpu.py" > /dev/null; do sleep 5; done  # no GPU sharing while timing
  tail -5 "$W/logs/vllm_gpu_tests.log"
  setsid bash -c "python3 -m bench vllm --model $GGUF --out-dir $W/results $* \
      > $W/logs/bench_vllm.log 2>&1; echo exit \$? >> $W/logs/bench_vllm.log" \
      < /dev/null > /dev/null 2>&1 &
  echo "started: python -m bench vllm --model $GGUF $*"
  ;;
wait)
  wait_for_jobs "$2" "bench vllm|test_vllm_gpu.py" 8 -vE "^\s*$"
  ;;
collect)
  cd "$W" && tar czf "$OUT/vllm_session.tar.gz" results logs 2>/dev/null
  ls -la "$OUT"
  ;;
*)
  sed -n 2,20p "$0"; exit 2 ;;
esac
