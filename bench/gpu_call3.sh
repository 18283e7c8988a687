#!/usr/bin/env bash
# GPU call 3: training benchmarks on random-weight shapes (0.5B update, 7B PPO memory,
# chunked log-probs, packing); stages SmolLM2's GGUF part 1 for call 4.
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:.
cp .carry1/part /root/gguf_part1 &
timeout 330 python3 bench/bench_train.py --only update_05b,ppo_7b,logprob_memory,packing \
  --ppo-engines hf,fast --out $OUT/bench_train_shapes.json 2>&1 | tail -45
wait
