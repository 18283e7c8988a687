"""Generated multiplication and division problems for the calculator-tool example.

``a * b`` with a 4-digit ``a`` and a 3-digit ``b``, and the exact division ``(a*b) / b``:
beyond what a 135M model computes in its head, one calculator call away. Train and test
are disjoint by construction: each unordered pair ``{a, b}`` is hashed (independently of
the seed) to one split, so a test product, its mirror and its division are never
trained on. Deterministic for a seed. Writes jsonl (``prompt``/``answer``) with
``python -m danka.data.calc_task OUT_DIR``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
from pathlib import Path

from danka.errors import UserError
from danka.types import PromptRow

CALC_SOURCE = "danka/calculator"
TEMPLATES = {"*": "What is {a} * {b}?", "/": "What is {p} / {b}?"}
TEST_PERCENT = 20


def calc_split(a: int, b: int) -> str:
    """``"train"`` or ``"test"`` for the unordered pair ``{a, b}``; stable across seeds."""
    lo, hi = sorted((a, b))
    digest = hashlib.sha256(f"calc:{lo}*{hi}".encode()).digest()
    return "test" if int.from_bytes(digest[:4], "big") % 100 < TEST_PERCENT else "train"


def calc_rows(
    n: int, *, seed: int, split: str = "train", a_range=(1000, 9999), b_range=(100, 999)
) -> list[PromptRow]:
    """``n`` distinct problems of ``split`` (half products, half exact divisions)."""
    if split not in ("train", "test"):
        raise UserError(f"unknown split {split!r}", "calculator task", "use train or test")
    rng = random.Random(f"{seed}:calc:{split}")
    seen: set[tuple[str, int, int]] = set()
    rows: list[PromptRow] = []
    tries = 0
    while len(rows) < n:
        tries += 1
        if tries > 100 * n + 1000:
            raise UserError(f"cannot draw {n} distinct {split} problems", "calculator task")
        a, b = rng.randint(*a_range), rng.randint(*b_range)
        op = rng.choice("*/")
        if calc_split(a, b) != split or (op, a, b) in seen:
            continue
        seen.add((op, a, b))
        prompt = TEMPLATES[op].format(a=a, b=b, p=a * b)
        answer = a * b if op == "*" else a
        rows.append(
            PromptRow(
                index=len(rows),
                prompt=prompt,
                ground_truth=str(answer),
                data_source=CALC_SOURCE,
                extra={"a": a, "b": b, "op": op, "split": split},
            )
        )
    return rows


def write_calc_task(out_dir: Path, *, train: int, test: int, seed: int) -> list[Path]:
    """``train.jsonl`` and ``test.jsonl`` under ``out_dir`` (``prompt``/``answer`` rows)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for split, n in (("train", train), ("test", test)):
        path = out_dir / f"{split}.jsonl"
        with path.open("w") as f:
            for row in calc_rows(n, seed=seed, split=split):
                f.write(json.dumps({"prompt": row.prompt, "answer": row.ground_truth}) + "\n")
        paths.append(path)
    return paths


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--train", type=int, default=2000)
    parser.add_argument("--test", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    for p in write_calc_task(args.out_dir, train=args.train, test=args.test, seed=args.seed):
        print(p)
