#!/usr/bin/env bash
# Sourced by the bench/gpu/*.sh session scripts: the steps their calls share. Needs $W (the
# session's folder on the GPU machine, with its logs under $W/logs).

# wait_for_jobs SECONDS PATTERN LINES GREP_ARGS...: wait at most SECONDS while a process
# whose command line matches PATTERN (pgrep -f) runs; then, of each log, the last LINES
# lines that `grep GREP_ARGS` keeps, and the GPU's memory in use and utilisation.
wait_for_jobs() {
  local end=$(( $(date +%s) + $1 )) pattern=$2 lines=$3 f
  shift 3
  while [ "$(date +%s)" -lt "$end" ]; do
    pgrep -f "$pattern" > /dev/null || break
    sleep 10
  done
  for f in "$W"/logs/*.log; do echo "== $f"; grep "$@" "$f" | tail -"$lines"; done
  nvidia-smi --query-gpu=memory.used,utilization.gpu --format=csv
}
