#!/usr/bin/env bash
# GPU call 5: GPU-marked tests (fast engine graphs, tiny trainer in bf16); stages GGUF part 1.
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:.
cp .carry1/part /root/gguf_part1 &
timeout 150 python3 -m pytest -m gpu tests/rollout tests/trainer -q -p no:cacheprovider 2>&1 | tail -15
wait
