#!/usr/bin/env bash
# Reward model from GSM8K pairs, then GRPO trained on it with the strict GSM8K rule reward
# logged beside it (weight 0), on one GPU (~5-6 min). Run from the repository root:
#   bash bench/gpu/rm_rl.sh [GSM8K_DIR]     # GSM8K_DIR holds train.jsonl/test.jsonl
#                                           # (default shared/data/gsm8k)
# Writes bench/results/rm_gsm8k_smollm2_gpu.json and rl_with_rm_gpu.json (copied to $OUT).
set -euo pipefail
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
GSM=${1:-shared/data/gsm8k}
W=output/rm_rl_gpu
DEV=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
DATE=$(date -u +%F)
rm -rf "$W" && mkdir -p "$W" bench/results
python -m danka data gsm8k-pairs --input "$GSM/train.jsonl" --output "$W/pairs" \
  --test-fraction 0.0268                                   # 200 held-out questions
for s in wrong_number refusal; do                          # ~1 min each
  python -m danka rm examples/rm_gsm8k.yaml data.train_dataset="$PWD/$W/pairs/$s/train.jsonl" \
    data.eval_dataset="$PWD/$W/pairs/$s/test.jsonl" trainer.max_train_minutes=1 \
    trainer.batch_size=32 trainer.micro_batch_size=32 output_dir="$W/rm_$s"
done
python - "$W" "$DEV" "$DATE" <<'PY'
import json, sys
w, dev, date = sys.argv[1:]
sets = {s: json.load(open(f"{w}/rm_{s}/rm_result.json")) for s in ("wrong_number", "refusal")}
out = {"device": dev, "date": date, "model": "HuggingFaceTB/SmolLM2-135M-Instruct",
       "command": "bash bench/gpu/rm_rl.sh", "sets": {s: {
           "accuracy_before": r["accuracy_before"], "accuracy_after": r["accuracy"],
           "n": r["n"], "steps": r["steps"], "minutes": r["minutes"], "margin": r["margin"]}
           for s, r in sets.items()}}
json.dump(out, open("bench/results/rm_gsm8k_smollm2_gpu.json", "w"), indent=2)
print(json.dumps(out, indent=2))
PY
python -m danka train examples/gsm8k_grpo_rm_smollm2.yaml \
  model.reward_model_name_or_path="$W/rm_wrong_number/model" \
  data.train_dataset="$GSM/train.jsonl" data.eval_dataset="$GSM/test.jsonl" \
  trainer.max_train_minutes=3 output_dir="$W/grpo"
python -m bench rm-tracking "$W/grpo" --out bench/results/rl_with_rm_gpu.json \
  --device "$DEV" --date "$DATE" --command "bash bench/gpu/rm_rl.sh"
[ -n "${OUT:-}" ] && cp bench/results/rm_gsm8k_smollm2_gpu.json bench/results/rl_with_rm_gpu.json \
  "$W/grpo/metrics.jsonl" "$OUT"/ || true
