"""Offline tasks for the quickstart: generated problems with exact answers, no download.

Train and test are disjoint by construction: each unordered pair ``{a, b}`` is hashed
(independently of the seed) to one split, so a held-out problem, or its mirror
``b + a``, is never trained on, whatever seeds the two runs use.
"""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path
from typing import Any

from danka.data.files import write_text_atomic
from danka.errors import UserError
from danka.types import PromptRow

ARITHMETIC_SOURCE = "danka/arithmetic"
ARITHMETIC_TEMPLATE = "What is {a} + {b}? Reply with only the number."
TEST_FRACTION_PERCENT = 20  # share of (a, b) pairs hashed to the test split


def pair_split(a: int, b: int) -> str:
    """``"train"`` or ``"test"`` for the unordered pair ``{a, b}``; stable across runs."""
    lo, hi = sorted((a, b))
    digest = hashlib.sha256(f"{lo}+{hi}".encode()).digest()
    return "test" if int.from_bytes(digest[:4], "big") % 100 < TEST_FRACTION_PERCENT else "train"


def arithmetic_rows(
    n: int, *, seed: int, split: str = "train", low: int = 10, high: int = 99
) -> list[PromptRow]:
    """``n`` problems "What is a + b?" with ``low <= a, b <= high`` from ``split``'s pairs.

    Deterministic for ``seed``. Pairs are distinct while ``n`` fits the split's pool
    (about 80% / 20% of the ``(high - low + 1)**2`` ordered pairs); beyond that the pool
    is reshuffled and repeated.
    """
    if split not in ("train", "test"):
        raise UserError(f"unknown split {split!r}", "arithmetic task", "use train or test")
    if low > high:
        raise UserError(f"low {low} > high {high}", "arithmetic task", "set low <= high")
    pool = [
        (a, b)
        for a in range(low, high + 1)
        for b in range(low, high + 1)
        if pair_split(a, b) == split
    ]
    if not pool:
        raise UserError(
            f"no {split} problems with operands in [{low}, {high}]",
            "arithmetic task",
            "widen the operand range",
        )
    rng = random.Random(f"{seed}:{split}")
    pairs: list[tuple[int, int]] = []
    while len(pairs) < n:
        pairs += rng.sample(pool, min(len(pool), n - len(pairs)))
    return [
        PromptRow(
            index=i,
            prompt=ARITHMETIC_TEMPLATE.format(a=a, b=b),
            ground_truth=str(a + b),
            data_source=ARITHMETIC_SOURCE,
            extra={"a": a, "b": b, "split": split},
        )
        for i, (a, b) in enumerate(pairs)
    ]


def row_to_record(row: PromptRow) -> dict[str, Any]:
    """A JSON-able record in TRL layout that :func:`load_prompt_rows` reads back as ``row``."""
    return {
        "prompt": row.prompt,
        "ground_truth": row.ground_truth,
        "data_source": row.data_source,
        **row.extra,
    }


def write_rows_jsonl(rows: list[PromptRow], path: Path) -> Path:
    """Write ``rows`` as JSON lines (atomically: temp file + rename); returns ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = "".join(json.dumps(row_to_record(r), ensure_ascii=False) + "\n" for r in rows)
    write_text_atomic(path, text)
    return path
