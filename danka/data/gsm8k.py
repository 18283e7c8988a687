"""GSM8K (Cobbe et al. 2021, https://arxiv.org/abs/2110.14168) in verl's row layout.

An official row is ``{"question": str, "answer": str}`` whose answer ends with
``#### <number>``. verl's ``examples/data_preprocess/gsm8k.py`` turns it into::

    {"data_source": "openai/gsm8k",
     "prompt": [{"role": "user", "content": question + " " + GSM8K_INSTRUCTION}],
     "ability": "math",
     "reward_model": {"style": "rule", "ground_truth": "72"},
     "extra_info": {"split": "train", "index": 0, "answer": ..., "question": ...}}

:func:`convert_gsm8k` writes that layout as Parquet and JSON lines, so the result loads
with ``fmt: verl`` here and in verl itself.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from danka.data.files import read_records, write_parquet_atomic, write_text_atomic
from danka.errors import UserError

GSM8K_SOURCE = "openai/gsm8k"
GSM8K_INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'
_NUMBER = re.compile(r"-?[0-9]+(?:\.[0-9]+)?")


def find_gsm8k_answer(text: str) -> str | None:
    """The final answer after the last ``####`` (commas and ``$`` removed), or None.

    ``"... #### 1,234"`` -> ``"1234"``; a non-numeric tail is returned stripped;
    no ``####`` or nothing after it -> None.
    """
    if "####" not in text:
        return None
    tail = text.rsplit("####", 1)[1].strip().replace(",", "").replace("$", "").strip()
    match = _NUMBER.match(tail)
    if match:
        return match.group(0)
    return tail or None


def reference_answer(answer_text: str) -> str:
    """Like :func:`find_gsm8k_answer` but raises ValueError when there is no answer."""
    found = find_gsm8k_answer(answer_text)
    if found is None:
        raise ValueError(f"no '#### <answer>' in GSM8K answer: {answer_text[-80:]!r}")
    return found


def gsm8k_to_verl(question: str, answer: str, *, split: str, index: int) -> dict[str, Any]:
    """One official GSM8K row in verl's layout (see the module docstring)."""
    return {
        "data_source": GSM8K_SOURCE,
        "prompt": [{"role": "user", "content": question + " " + GSM8K_INSTRUCTION}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": reference_answer(answer)},
        "extra_info": {"split": split, "index": index, "answer": answer, "question": question},
    }


def official_row(where: str, record: dict) -> tuple[str, str, str]:
    """``(question, answer, ground truth)`` of an official GSM8K record, or a UserError at
    ``where`` (file:line) naming what is wrong with it."""
    question, answer = record.get("question"), record.get("answer")
    if not isinstance(question, str) or not isinstance(answer, str):
        raise UserError(
            f"not an official GSM8K row: needs string 'question' and 'answer', "
            f"has keys {sorted(record)}",
            where,
            "use the official GSM8K files (one {question, answer} object per line)",
        )
    try:
        return question, answer, reference_answer(answer)
    except ValueError as err:
        raise UserError(str(err), where, "each GSM8K answer must end with '#### <number>'") from err


def convert_gsm8k(
    *, input_path: Path | None, from_hub: bool, output_dir: Path, limit: int | None = None
) -> dict[str, Any]:
    """Convert official GSM8K rows to ``{split}.parquet`` and ``{split}.jsonl`` in ``output_dir``.

    ``input_path``: an official ``train.jsonl``/``test.jsonl`` (or .parquet); the split is
    the file's stem. ``from_hub``: both splits of ``openai/gsm8k`` (config ``main``).
    ``limit`` keeps the first rows of each split. Files are written atomically.
    Returns ``{"output_dir", "splits": {split: n_rows}, "files": [paths]}``.
    """
    if (input_path is None) == (not from_hub):
        raise UserError(
            "give exactly one of an input file or from_hub",
            "gsm8k converter",
            "pass --input train.jsonl (the official file) or --from-hub",
        )
    if from_hub:
        sources = {s: read_records(f"{GSM8K_SOURCE}:main", split=s) for s in ("train", "test")}
    else:
        sources = {Path(input_path).stem: read_records(str(input_path))}

    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    summary: dict[str, Any] = {"output_dir": str(output_dir), "splits": {}, "files": []}
    for split, records in sources.items():
        rows = []
        for index, (where, record) in enumerate(records[:limit] if limit else records):
            question, answer, _ = official_row(where, record)
            rows.append(gsm8k_to_verl(question, answer, split=split, index=index))
        parquet, jsonl = output_dir / f"{split}.parquet", output_dir / f"{split}.jsonl"
        write_parquet_atomic(rows, parquet)
        write_text_atomic(jsonl, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
        summary["splits"][split] = len(rows)
        summary["files"] += [str(parquet), str(jsonl)]
    return summary
