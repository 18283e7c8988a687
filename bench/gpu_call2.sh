#!/usr/bin/env bash
# GPU call 2: join the SmolLM2 GGUF, then the GSM8K GRPO learning run (before/after eval).
set -uo pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:.
cat /root/gguf_part1 .carry2/part .carry2/part_b > /root/smollm2.gguf && sha256sum /root/smollm2.gguf
timeout 100 python3 -m pytest tests/trainer/test_train_gpu.py -q -p no:cacheprovider -x 2>&1 | tail -15
mkdir -p /root/run
timeout 470 python3 -m danka train examples/gsm8k_grpo_smollm2.yaml \
  model.actor_model_name_or_path=/root/smollm2.gguf data.train_dataset=.gdata/train.jsonl \
  data.eval_dataset=.gdata/test.jsonl output_dir=/root/run/gsm8k_grpo trainer.max_train_minutes=3.5 \
  logging.progress=false "$@" 2>&1 | grep -v Warning | tail -40
cd /root/run/gsm8k_grpo && cp metrics.jsonl result.json logs/train.log $OUT/ 2>/dev/null
ls eval; cp eval/step_0.json $OUT/eval_first.json; cp $(ls -v eval/*.json | tail -1) $OUT/eval_last.json
cp plots/*.png $OUT/ 2>/dev/null | head -2; ls plots 2>/dev/null
