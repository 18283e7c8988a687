"""Offline tasks: generated problems with exact answers, no download.

``arithmetic`` (the quickstart): "What is a + b? Reply with only the number." (or its own
``template``: the quickstart asks "What is a + b?" after a worked example in data.examples).
``chain``: a short chain of additions and subtractions worked out one step per line and
answered after "####" ("What is 64 - 17? ..." -> "64 - 17 = 47\n#### 47"), after one
worked example turn: the reasoning example.
``calculator`` (danka.data.calc_task): products and divisions for the tool-use example.

``TASKS`` maps ``data.task`` to a generator ``fn(n, *, seed, split) -> list[PromptRow]``.
Train and test are disjoint by construction: each problem is hashed (independently of
the seed) to one split on a key that is the same for its reorderings (``{a, b}`` for
``a + b``; the multiset of signed terms for a chain), so a held-out problem, or one
that differs only in the order of its terms, is never trained on, whatever seeds the two
runs use.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import random
import string
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from danka.data.calc_task import calc_rows
from danka.data.files import write_text_atomic
from danka.errors import UserError
from danka.limits import check_template
from danka.registry import Registry
from danka.types import PromptRow

ARITHMETIC_SOURCE = "danka/arithmetic"
ARITHMETIC_TEMPLATE = "What is {a} + {b}? Reply with only the number."
TEST_FRACTION_PERCENT = 20  # share of (a, b) pairs hashed to the test split
MAX_POOL = 4_000_000  # (a, b) pairs listed in memory: operands of up to 2000 values
MAX_OPERAND = 10**9  # a data.task_kwargs number: problems for a language model, not bignums


def pair_split(a: int, b: int) -> str:
    """``"train"`` or ``"test"`` for the unordered pair ``{a, b}``; stable across runs."""
    lo, hi = sorted((a, b))
    digest = hashlib.sha256(f"{lo}+{hi}".encode()).digest()
    return "test" if int.from_bytes(digest[:4], "big") % 100 < TEST_FRACTION_PERCENT else "train"


def arithmetic_rows(
    n: int,
    *,
    seed: int,
    split: str = "train",
    low: int = 10,
    high: int = 99,
    template: str = ARITHMETIC_TEMPLATE,
) -> list[PromptRow]:
    """``n`` problems "What is a + b?" with ``low <= a, b <= high`` from ``split``'s pairs,
    asked as ``template`` (with ``{a}`` and ``{b}``; e.g. without the "Reply with only the
    number." when a worked example in data.examples shows the answer's form).

    Deterministic for ``seed``. Pairs are distinct while ``n`` fits the split's pool
    (about 80% / 20% of the ``(high - low + 1)**2`` ordered pairs); beyond that the pool
    is reshuffled and repeated.
    """
    if split not in ("train", "test"):
        raise UserError(f"unknown split {split!r}", "arithmetic task", "use train or test")
    if low > high:
        raise UserError(f"low {low} > high {high}", "arithmetic task", "set low <= high")
    try:  # a typo in the template fails here, before any model loads
        template.format(a=low, b=high)
    except (KeyError, IndexError, ValueError) as e:
        raise UserError(
            f"template {template!r} cannot be filled: {e!r}"[:200],
            "data.task_kwargs.template",
            'e.g. "What is {a} + {b}?"',
        ) from None
    if (high - low + 1) ** 2 > MAX_POOL:  # every pair is listed below
        raise UserError(
            f"operands {low}..{high} make {(high - low + 1) ** 2:,} pairs, over {MAX_POOL:,}",
            "data.task_kwargs",
            "narrow low..high (the quickstart uses 10..99)",
        )
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
            prompt=template.format(a=a, b=b),
            ground_truth=str(a + b),
            data_source=ARITHMETIC_SOURCE,
            extra={"a": a, "b": b, "split": split},
        )
        for i, (a, b) in enumerate(pairs)
    ]


CHAIN_SOURCE = "danka/chain"
CHAIN_TEMPLATE = (
    'What is {expr}? Work it out one step per line, then write the final answer after "####".'
)
# One worked exchange before the question. SmolLM2-135M-Instruct ignores a written
# instruction to answer after "####" (0% strict on every chain measured without it) and
# copies an example placed inside the question; as its own earlier answer it follows the
# format. Writing the equation is the reasoning that matters: 46% of two-digit sums right
# with it, 2% when the example answers with the bare "#### 83" (bench/learning/task_candidates.py).
CHAIN_DEMO = (("What is 36 + 47? " + CHAIN_TEMPLATE.split("? ", 1)[1], "36 + 47 = 83\n#### 83"),)


def chain_key(terms: list[int]) -> str:
    """The split key of a chain of signed terms (``23 + 41 - 17`` -> ``[23, 41, -17]``):
    the sorted terms, so every reordering of a problem lands in the same split."""
    return ",".join(str(t) for t in sorted(terms))


def chain_split(terms: list[int]) -> str:
    """``"train"`` or ``"test"`` for a chain of signed terms; stable across runs."""
    digest = hashlib.sha256(f"chain:{chain_key(terms)}".encode()).digest()
    return "test" if int.from_bytes(digest[:4], "big") % 100 < TEST_FRACTION_PERCENT else "train"


def chain_expression(terms: list[int]) -> str:
    """``[23, 41, -17]`` -> ``"23 + 41 - 17"`` (the first term is positive)."""
    text = str(terms[0])
    for t in terms[1:]:
        text += f" + {t}" if t >= 0 else f" - {-t}"
    return text


def chain_rows(
    n: int,
    *,
    seed: int,
    split: str = "train",
    length: int = 2,
    low: int = 10,
    high: int = 99,
    subtract: bool = True,
    template: str = CHAIN_TEMPLATE,
    first: tuple[int, int] | None = None,
    demo: tuple[tuple[str, str], ...] = CHAIN_DEMO,
) -> list[PromptRow]:
    """``n`` problems ``t_1 +- t_2 +- ... t_length`` with ``low <= |t_i| <= high`` from
    ``split``, whose answer (and every partial sum) is >= 0, each term after the first
    added or (``subtract``) subtracted with probability 1/2. ``first = (lo, hi)`` draws
    the first term from its own range (e.g. a two-digit start, one-digit steps). ``demo``:
    (question, answer) turns put before the question, so the prompt is chat messages
    (a worked example the model reads as its own earlier answer).

    Deterministic for ``seed``. Problems are distinct up to reordering while ``n`` fits
    the split's pool; a small pool (one-digit terms) is drawn from again once exhausted.
    """
    if split not in ("train", "test"):
        raise UserError(f"unknown split {split!r}", "chain task", "use train or test")
    if not (1 <= low <= high) or not 2 <= length <= 100:
        raise UserError(
            f"need 1 <= low <= high and 2 <= length <= 100, got {low}, {high}, {length}",
            "chain task",
            "e.g. length 3, low 10, high 99",
        )
    rng = random.Random(f"{seed}:chain:{split}")
    rows: list[PromptRow] = []
    seen: set[str] = set()
    misses = 0
    lo0, hi0 = first or (low, high)
    while len(rows) < n:
        if misses > 1000 * (len(rows) + 1) + 100_000:  # the split holds (almost) no problem
            raise UserError(
                f"cannot draw {n} {split} problems with these options",
                "data.task_kwargs",
                "widen low..high or raise length",
            )
        terms = [rng.randint(lo0, hi0)]
        for _ in range(length - 1):
            t = rng.randint(low, high)
            terms.append(-t if subtract and rng.random() < 0.5 else t)
        partial = [sum(terms[: k + 1]) for k in range(length)]
        key = chain_key(terms)
        fresh = key not in seen or misses > 50 * n  # a small pool: repeats allowed
        if min(partial) < 0 or chain_split(terms) != split or not fresh:
            misses += 1
            continue
        seen.add(key)
        question = template.format(expr=chain_expression(terms))
        if any(question == q for q, _ in demo):  # the worked example is never asked
            misses += 1
            continue
        prompt: str | list[dict[str, str]] = question
        if demo:
            prompt = [
                {"role": r, "content": c}
                for q, a in demo
                for r, c in (("user", q), ("assistant", a))
            ]
            prompt.append({"role": "user", "content": question})
        rows.append(
            PromptRow(
                index=len(rows),
                prompt=prompt,
                ground_truth=str(partial[-1]),
                data_source=CHAIN_SOURCE,
                extra={"terms": terms, "split": split},
            )
        )
    return rows


@dataclass(frozen=True)
class TaskMeta:
    """What ``--help-config`` and error messages say about a task."""

    description: str


TaskFn = Callable[..., list[PromptRow]]  # fn(n, *, seed, split) -> rows
TASKS: Registry[TaskMeta] = Registry("task", TaskMeta(""))
TASKS.add("arithmetic", arithmetic_rows, TaskMeta("What is a + b? (two-digit), the quickstart"))
TASKS.add(
    "chain",
    chain_rows,
    TaskMeta("What is a + b? / a - b? (two-digit, worked in a line, answer after ####)"),
)
TASKS.add("calculator", calc_rows, TaskMeta("a * b and (a*b) / b, for the calculator tool"))


def task_rows(
    name: str, n: int, *, seed: int, split: str, kwargs: dict[str, Any] | None = None
) -> list[PromptRow]:
    """``n`` rows of task ``name`` from ``split``; ``kwargs`` (``data.task_kwargs``) go to its
    generator. UserError naming data.task / data.task_kwargs if either is wrong."""
    check_task_options(name, kwargs)
    return TASKS.get(name, where="data.task")(n, seed=seed, split=split, **(kwargs or {}))


def check_task_options(name: str, kwargs: dict[str, Any] | None) -> None:
    """UserError naming the ``data.task_kwargs`` key task ``name`` cannot take (run by
    the config check too, so a bad option is refused before any row is made)."""
    fn = TASKS.get(name, where="data.task")
    kwargs = dict(kwargs or {})
    allowed = [
        p.name
        for p in inspect.signature(fn).parameters.values()
        if p.kind == p.KEYWORD_ONLY and p.name not in ("seed", "split")
    ]
    unknown = sorted(set(kwargs) - set(allowed))
    if unknown:
        raise UserError(
            f"task {name!r} takes no option {', '.join(unknown)}",
            where="data.task_kwargs",
            fix=f"options of {name}: {', '.join(allowed) or 'none'}",
        )
    defaults = {p.name: p.default for p in inspect.signature(fn).parameters.values()}
    for key, value in kwargs.items():
        _check_option(f"data.task_kwargs.{key}", value, defaults[key])


def _check_option(key: str, value: Any, default: Any) -> None:
    """UserError unless ``value`` has the kind of the option's default: an integer within
    +-MAX_OPERAND, a bool, a string, a pair of integers (or None where the default is)."""
    numbers = [value] if isinstance(default, int) and not isinstance(default, bool) else []
    if isinstance(default, tuple) and all(isinstance(x, int) for x in default):
        if not isinstance(value, (list, tuple)) or len(value) != len(default):
            raise UserError(
                f"expected a list of {len(default)} integers, got {value!r}"[:200],
                where=key,
                fix=f"e.g. {key.rsplit('.', 1)[1]}: {list(default)}",
            )
        numbers = list(value)
    for x in numbers:
        if isinstance(x, bool) or not isinstance(x, int) or abs(x) > MAX_OPERAND:
            raise UserError(
                f"expected an integer of at most {MAX_OPERAND:,}, got {x!r}"[:200],
                where=key,
                fix=f"e.g. {key.rsplit('.', 1)[1]}: {default!r}",
            )
    if isinstance(default, (bool, str)) and not isinstance(value, type(default)):
        raise UserError(
            f"expected {type(default).__name__}, got {value!r}"[:200],
            where=key,
            fix=f"e.g. {key.rsplit('.', 1)[1]}: {default!r}",
        )
    if isinstance(default, str):  # a template: the placeholders of the default's
        names = [f for _, f, _, _ in string.Formatter().parse(default) if f]
        check_template(key, value, list(dict.fromkeys(names)))


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
