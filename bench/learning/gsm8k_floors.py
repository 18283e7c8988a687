"""GSM8K floors: the strict accuracy of answers that do no reasoning at all.

    python -m bench gsm8k-floors --test PATH/test.jsonl --name gsm8k_floors

A model that learned only the ``#### N`` format scores something without reading the
question; a learning result means little until it beats these. Each floor answers every
test question with ``#### X`` and scores it with danka's own ``gsm8k`` reward (verl's strict
rule, the one the learning runs report):

- ``constant``: X = the most common ground-truth answer of the test set;
- ``last_number_of_question``: X = the last number written in the question.
"""

from __future__ import annotations

import json
import platform
import time
from pathlib import Path

from bench.lib.common import add_output_args, parser, write_result
from danka.data.gsm8k import official_row
from danka.diagnose.floors import guess_answers
from danka.rewards.builtin import gsm8k
from danka.types import PromptRow


def load_test(path: Path) -> list[PromptRow]:
    """GSM8K's ``{"question", "answer"}`` rows; the ground truth is the number after ####."""
    rows = []
    for i, line in enumerate(path.read_text().splitlines()):
        if line.strip():
            question, _, truth = official_row(f"{path}:{i + 1}", json.loads(line))
            rows.append(PromptRow(index=i, prompt=question, ground_truth=truth))
    return rows


def strict_accuracy(rows: list[PromptRow], answers: list[str]) -> float:
    """Mean strict ``gsm8k`` reward of ``#### answer`` over the rows."""
    return sum(gsm8k(f"#### {a}", r) for a, r in zip(answers, rows)) / len(rows)


def floors(rows: list[PromptRow]) -> dict:
    guesses = guess_answers(rows)  # the run doctor's guesses (danka.diagnose.floors)
    common = guesses["common_answer"][0]
    return {
        "constant": {"answer": f"#### {common}",
                     "times_right": sum(r.ground_truth == common for r in rows),
                     "strict": strict_accuracy(rows, guesses["common_answer"])},
        "last_number_of_question": {"strict": strict_accuracy(rows, guesses["last_prompt_number"])},
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = parser("gsm8k-floors", __doc__)
    ap.add_argument("--test", required=True, type=Path, help="GSM8K test.jsonl")
    add_output_args(ap)
    args = ap.parse_args(argv)
    rows = load_test(args.test)
    res = {
        "bench": "gsm8k-floors",
        "date": time.strftime("%Y-%m-%d"),
        "device": f"CPU ({platform.machine()})",
        "command": f"python -m bench gsm8k-floors --test {args.test}",
        "n": len(rows),
        "reward": "danka gsm8k, method strict (verl's rule)",
        "floors": floors(rows),
    }
    write_result(res, args.out_dir, args.name or "gsm8k_floors")
    print(json.dumps(res["floors"]))
    return 0
