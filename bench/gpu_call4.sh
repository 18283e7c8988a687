#!/usr/bin/env bash
# GPU call 4: SmolLM2 (joined GGUF): rollout HF vs fast, GRPO step at TRL's settings.
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:.
cat /root/gguf_part1 .carry2/part .carry2/part_b > /root/smollm2.gguf && sha256sum /root/smollm2.gguf
timeout 150 python3 bench/bench_rollout.py --model /root/smollm2.gguf --out $OUT/rollout_smollm2.json 2>&1 | tail -16
timeout 300 python3 bench/bench_train.py --only grpo_step,packing --model /root/smollm2.gguf \
  --data .gdata/train.jsonl --out $OUT/bench_train_grpo.json 2>&1 | tail -25
