"""Held-out pairwise accuracy of reward models on several pair sets (every model x every set).

    python -m bench rm-eval --pairs wrong_number=P/wrong_number/test.jsonl \
        --pairs refusal=P/refusal/test.jsonl --model untrained=base \
        --model rm_wrong=output/rm_wrong/model --max-length 96 --out result.json

``--model NAME=base`` is ``--base``'s backbone with the fresh head ``danka rm`` starts from
(same seed, ``--seed``, default the config default 42), i.e. the accuracy before training;
any other value is a folder written by ``danka rm``. Texts are rendered and truncated
(from the left, ``--max-length`` tokens) exactly as ``danka rm`` evaluates them.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch

from bench.lib.common import parser


def _model(spec: str, base: str, seed: int):
    from danka.models.classifier import load_score_model
    from danka.rewards.model import ClassifierReward

    if spec == "base":
        return load_score_model(base, seed=seed)
    rm = ClassifierReward.from_pretrained(spec)
    return rm.model, rm.tokenizer


def main(argv: list[str] | None = None) -> int:
    from danka.data.pairs import load_pairs
    from danka.rewards.model import ClassifierReward
    from danka.rm.train import _Pairs, evaluate_pairs

    ap = parser("rm-eval", __doc__)
    ap.add_argument("--pairs", action="append", required=True, help="NAME=path.jsonl")
    ap.add_argument("--model", action="append", required=True, help="NAME=base|folder")
    ap.add_argument("--base", default="HuggingFaceTB/SmolLM2-135M-Instruct")
    ap.add_argument("--seed", type=int, default=42)
    ap.add_argument("--max-length", type=int, default=384)
    ap.add_argument("--batch", type=int, default=8, help="pairs per forward")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    sets = dict(s.split("=", 1) for s in args.pairs)
    result: dict = {"max_length": args.max_length, "base": args.base, "models": {}}
    for name, spec in (m.split("=", 1) for m in args.model):
        model, tokenizer = _model(spec, args.base, args.seed)
        scorer = ClassifierReward(model, tokenizer)  # renders texts as RL scoring does
        result["models"][name] = {"path": spec, "sets": {}}
        for set_name, path in sets.items():
            t0 = time.perf_counter()
            pairs = _Pairs(load_pairs(path, split="test")[0], scorer)
            stats = evaluate_pairs(
                model, tokenizer, pairs, batch=args.batch, max_length=args.max_length,
                device=torch.device("cpu"),
            )  # fmt: skip
            stats["seconds"] = time.perf_counter() - t0
            result["models"][name]["sets"][set_name] = stats
            print(name, set_name, {k: round(v, 4) for k, v in stats.items()}, flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0
