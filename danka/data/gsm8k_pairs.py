"""Preference pairs built offline from GSM8K rows (``danka data gsm8k-pairs``).

For each official ``{"question", "answer"}`` row the prompt is the question with danka's
GSM8K instruction as one user message (the prompt an RL run on the verl layout sees), the
chosen answer is the reference solution, and the rejected answer is either

- ``wrong_number/``: the same solution with a wrong final number after ``####`` (the
  reasoning is untouched, so the model must notice that the answer does not follow), or
- ``refusal/``: a refusal ("I'm sorry, I can't solve this.").

Both sets share one train/test split of the questions, written as TRL-layout jsonl:
``OUTPUT/{wrong_number,refusal}/{train,test}.jsonl``.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from danka.data.files import read_records, write_text_atomic
from danka.data.formats import Columns, to_prompt_row
from danka.data.gsm8k import GSM8K_INSTRUCTION, find_gsm8k_answer
from danka.errors import UserError

REFUSALS = (
    "I'm sorry, but I can't solve this problem.",
    "I don't know how to answer this question.",
    "Sorry, I am not able to help with that.",
    "I cannot work this out.",
)
PAIR_SETS = ("wrong_number", "refusal")


def wrong_number(answer: str, rng: random.Random) -> str:
    """A different number in the same style: ``"72"`` -> e.g. ``"75"``; decimals keep theirs."""
    value = float(answer)
    while True:
        delta = rng.choice([-10, -5, -3, -2, -1, 1, 2, 3, 5, 10])
        wrong = value + delta if rng.random() < 0.7 else value * rng.choice([2, 3, 0.5])
        text = str(int(wrong)) if float(wrong).is_integer() else f"{wrong:.2f}".rstrip("0")
        if text != answer and float(text) != value:
            return text


def with_wrong_final_number(solution: str, rng: random.Random) -> str:
    """``solution`` with the number after its last ``####`` replaced by a wrong one."""
    answer = find_gsm8k_answer(solution)
    if answer is None:
        raise ValueError("no '#### <number>' final answer")
    head = solution.rsplit("####", 1)[0]
    return f"{head}#### {wrong_number(answer, rng)}"


def build_gsm8k_pairs(
    *,
    input_path: Path,
    output_dir: Path,
    test_fraction: float = 0.1,
    limit: int | None = None,
    seed: int = 0,
) -> dict[str, Any]:
    """Write both pair sets; returns ``{"output_dir", "train", "test", "files"}``.

    The questions are shuffled with ``seed``; the last ``test_fraction`` (at least one)
    become the test split. ``limit`` keeps the first rows of the input.
    """
    if not 0.0 < test_fraction < 1.0:
        raise UserError(
            f"test fraction must be in (0, 1), got {test_fraction}",
            "--test-fraction",
            "e.g. 0.1",
        )
    records = read_records(str(input_path))[:limit] if limit else read_records(str(input_path))
    rng = random.Random(seed)
    rows: dict[str, list[dict[str, Any]]] = {name: [] for name in PAIR_SETS}
    for index, (where, record) in enumerate(records):
        row = to_prompt_row(record, index, where, Columns(fmt="gsm8k"))  # UserError names file:line
        question, solution = row.prompt, row.extra["answer"]
        try:
            wrong = with_wrong_final_number(solution, rng)
        except ValueError as err:
            raise UserError(str(err), where, "each answer must end with '#### <number>'") from err
        prompt = [{"role": "user", "content": f"{question} {GSM8K_INSTRUCTION}"}]
        for name, rejected in (("wrong_number", wrong), ("refusal", rng.choice(REFUSALS))):
            rows[name].append({"prompt": prompt, "chosen": solution, "rejected": rejected})
    if len(records) < 2:
        raise UserError("need at least 2 GSM8K rows", str(input_path), "give more rows")
    order = list(range(len(records)))
    random.Random(seed + 1).shuffle(order)
    n_test = max(1, int(len(order) * test_fraction))
    splits = {"train": order[:-n_test], "test": order[-n_test:]}
    files = []
    for name, items in rows.items():
        (output_dir / name).mkdir(parents=True, exist_ok=True)
        for split, idx in splits.items():
            path = output_dir / name / f"{split}.jsonl"
            text = "".join(json.dumps(items[i], ensure_ascii=False) + "\n" for i in idx)
            write_text_atomic(path, text)
            files.append(str(path))
    return {
        "output_dir": str(output_dir),
        "train": len(splits["train"]),
        "test": n_test,
        "files": files,
    }
