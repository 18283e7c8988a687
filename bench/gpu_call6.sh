#!/usr/bin/env bash
# GPU call 6: GRPO step at TRL's anchor settings on SmolLM2 (joined GGUF).
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:.
cat /root/gguf_part1 .carry2/part .carry2/part_b > /root/smollm2.gguf && sha256sum /root/smollm2.gguf
timeout 240 python3 bench/bench_train.py --only grpo_step --model /root/smollm2.gguf \
  --data .gdata/train.jsonl --out $OUT/bench_train_grpo.json 2>&1 | grep -v "GGUF\|Loading weights" | tail -20
