"""The single-card tutorial's data step: ``head -n 200 train.jsonl`` -> ``mini_gsm8k.json``.

The tutorial takes the first 200 rows of GSM8K's ``train.jsonl`` and writes them as JSON
lines with ``prompt`` (the question), ``response`` (the reference solution, ending in
``#### <answer>``) and ``reward`` (1.0: the reference is right; a placeholder the tutorial
replaces with model scoring, which danka does with its ``gsm8k`` rule on the ground truth
after ``####``). ``examples/single_card_ppo.yaml`` reads the result as
``data.train_dataset: ./mini_gsm8k.json``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from danka.data.files import read_records, write_text_atomic
from danka.data.gsm8k import GSM8K_SOURCE, official_row
from danka.errors import UserError

SEED_ROWS = 200


def seed_rows(records: list[tuple[str, dict]], n: int = SEED_ROWS) -> list[dict[str, Any]]:
    """The first ``n`` GSM8K records as ``{"prompt", "response", "reward"}`` rows."""
    rows = []
    for where, record in records[:n]:
        question, answer, _ = official_row(where, record)
        rows.append({"prompt": question, "response": answer, "reward": 1.0})
    return rows


def write_seed_mini(
    *,
    input_path: Path | None,
    from_hub: bool,
    output: Path,
    n: int = SEED_ROWS,
) -> dict[str, Any]:
    """Write ``output`` (JSON lines, atomically) from ``input_path`` or the Hub's
    ``openai/gsm8k`` train split. Returns ``{"output", "rows"}``."""
    if (input_path is None) == (not from_hub):
        raise UserError(
            "give --input FILE or --from-hub",
            where="danka data seed-mini",
            fix="danka data seed-mini --input train.jsonl (GSM8K's own file) or --from-hub",
        )
    if n < 1:
        raise UserError(f"-n must be >= 1, got {n}", where="-n", fix=f"e.g. -n {SEED_ROWS}")
    source = f"{GSM8K_SOURCE}:main" if from_hub else str(input_path)
    records = read_records(source, split="train") if from_hub else read_records(source)
    rows = seed_rows(records, n)
    output = Path(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(output, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    return {"output": str(output), "rows": len(rows)}
