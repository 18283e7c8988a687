#!/usr/bin/env bash
# GPU call 1: GPU-marked tests, the fast engine on random-weight shapes.
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:.
cp .carry1/part /root/gguf_part1 &
nvidia-smi --query-gpu=name,memory.used,memory.total,driver_version --format=csv
python3 -c "import torch, transformers, peft; print(torch.__version__, transformers.__version__, peft.__version__)"
timeout 200 python3 -m pytest -m gpu tests -q -p no:cacheprovider -x 2>&1 | tail -25
timeout 150 python3 bench/bench_rollout.py --shape qwen2-0.5b --out $OUT/rollout_qwen05.json 2>&1 | tail -25
timeout 120 python3 bench/bench_rollout.py --shape smollm2-135m --out $OUT/rollout_smollm2_random.json 2>&1 | tail -25
wait
ls -la /root/gguf_part1
