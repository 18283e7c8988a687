"""Row formats -> :class:`~danka.types.PromptRow`.

Formats (``data.format``):

- ``seed``: the single-card tutorial's ``{"prompt": str, "response": str, "reward": float}``, keys
  configurable. For RL only the prompt and a ground truth are used: the ground truth is
  the ``answer_key`` column if set, else the number after ``####`` in the response (then
  ``data_source`` becomes ``openai/gsm8k``, so the GSM8K rule reward applies), else None.
- ``trl``: TRL's prompt-only layout: ``prompt`` is a string or chat messages; every other
  column goes to ``extra`` (TRL passes columns to reward functions as keyword arguments).
  Ground truth from ``answer``, ``solution`` or ``ground_truth`` (the number after ``####``
  if the value is a GSM8K answer).
- ``verl``: ``data_source``, ``prompt`` (chat messages), ``ability``,
  ``reward_model: {style, ground_truth}``, ``extra_info``.
- ``gsm8k``: the official ``{"question", "answer"}`` files.
- ``auto``: from the keys of the row, first match wins: ``reward_model`` -> verl;
  ``question`` + ``answer`` without a prompt column -> gsm8k; prompt + response column ->
  seed; prompt column -> trl. :func:`load_prompt_rows` detects once, from the first rows,
  so that a later broken row gets a precise error instead of "unknown format".
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

from danka.data.files import read_records
from danka.data.gsm8k import GSM8K_SOURCE, find_gsm8k_answer
from danka.errors import UserError
from danka.types import PromptRow

FORMATS = ("auto", "seed", "trl", "verl", "gsm8k")
_TRL_ANSWER_KEYS = ("answer", "solution", "ground_truth")
T = TypeVar("T")
_DETECT_ROWS = 20  # rows looked at by load_prompt_rows' auto-detection


# The roles of a chat prompt (tool results as "tool", or "ipython" in Llama's templates).
CHAT_ROLES = ("system", "user", "assistant", "tool", "ipython")


class BadRow(ValueError):
    """A row that cannot become a PromptRow; turned into UserError or skipped by the caller."""


@dataclass(frozen=True)
class Columns:
    """A prompt-rows file's layout and which column holds what (``data.format`` and
    ``data.*_key``; the formats are in the module docstring)."""

    fmt: str = "auto"  # one of FORMATS
    prompt_key: str = "prompt"
    response_key: str = "response"  # seed format: the scored answer
    reward_key: str = "reward"  # seed format: the answer's score
    answer_key: str | None = None  # the ground-truth column; None: the format's own


@dataclass(frozen=True)
class ReadOptions:
    """How a rows file is read; prompt rows and preference pairs alike."""

    on_bad_row: str = "error"  # error: raise on the first bad row; skip: leave it out
    bad_rows_path: Path | None = None  # skipped rows are appended here as JSON lines
    limit: int | None = None  # stop after this many good rows
    base_dir: Path | None = None  # relative paths are read from here
    split: str = "train"  # the split read from a dataset folder or hub name
    dataset_type: str | None = None  # see :func:`danka.data.files.read_records`

    def __post_init__(self) -> None:
        if self.on_bad_row not in ("error", "skip"):
            raise UserError(
                f"unknown on_bad_row {self.on_bad_row!r}", "data.on_bad_row", "use error or skip"
            )


def detect_format(
    record: dict[str, Any], *, prompt_key: str = "prompt", response_key: str = "response"
) -> str | None:
    """The format name for ``record``'s keys (rules in the module docstring), or None."""
    if "reward_model" in record:
        return "verl"
    if "question" in record and "answer" in record and prompt_key not in record:
        return "gsm8k"
    if prompt_key in record and response_key in record:
        return "seed"
    if prompt_key in record:
        return "trl"
    return None


def to_prompt_row(
    record: dict[str, Any], index: int, location: str, columns: Columns = Columns()
) -> PromptRow:
    """Convert one raw record; a bad row raises UserError naming ``location`` and its keys."""
    try:
        return _convert(record, index, columns)
    except BadRow as err:
        raise _bad_row_error(err, record, location, columns.fmt) from None


def _bad_row_error(err: BadRow, record: dict, location: str, fmt: str) -> UserError:
    return UserError(
        f"bad row ({fmt} format): {err}; the row has keys {sorted(record)}",
        location,
        "fix or remove the row, set data.format / data.prompt_key to match the file, "
        "or set data.on_bad_row: skip",
    )


def _convert(record: dict[str, Any], index: int, c: Columns) -> PromptRow:
    fmt = c.fmt
    if fmt == "auto":
        fmt = detect_format(record, prompt_key=c.prompt_key, response_key=c.response_key) or ""
        if not fmt:
            raise BadRow(
                f"cannot detect the format: no {c.prompt_key!r} (seed/trl/verl) or "
                "'question'+'answer' (gsm8k) column"
            )
    if fmt not in _CONVERTERS:
        raise UserError(
            f"unknown data format {fmt!r}", "data.format", f"use one of {', '.join(FORMATS)}"
        )
    return _CONVERTERS[fmt](record, index, c)


def _seed(record, index, c: Columns) -> PromptRow:
    prompt = _prompt(record, c.prompt_key)
    data_source = record.get("data_source", "unknown")
    if c.answer_key is not None:
        truth = _truth(_required(record, c.answer_key), c.answer_key)
    else:
        response = record.get(c.response_key)
        if response is not None and not isinstance(response, str):
            raise BadRow(f"{c.response_key!r} must be a string, got {type(response).__name__}")
        truth = find_gsm8k_answer(response) if response else None
        if truth is not None and "data_source" not in record:
            data_source = GSM8K_SOURCE
    reward = record.get(c.reward_key)
    if reward is not None and not isinstance(reward, (int, float)):
        raise BadRow(f"{c.reward_key!r} must be a number, got {type(reward).__name__}")
    extra = {k: v for k, v in record.items() if k not in (c.prompt_key, "data_source")}
    return PromptRow(index, prompt, truth, str(data_source), extra)


def _trl(record, index, c: Columns) -> PromptRow:
    prompt = _prompt(record, c.prompt_key)
    keys = (c.answer_key,) if c.answer_key is not None else _TRL_ANSWER_KEYS
    truth, data_source = None, record.get("data_source", "unknown")
    for key in keys:
        if record.get(key) is not None:
            truth = _truth(record[key], key)
            if isinstance(record[key], str) and "####" in record[key]:
                truth = find_gsm8k_answer(record[key])
                data_source = record.get("data_source", GSM8K_SOURCE)
            break
    else:
        if c.answer_key is not None:
            raise BadRow(f"missing answer column {c.answer_key!r} (data.answer_key)")
    extra = {k: v for k, v in record.items() if k != c.prompt_key}
    return PromptRow(index, prompt, truth, str(data_source), extra)


def _verl(record, index, c: Columns) -> PromptRow:
    prompt = _prompt(record, c.prompt_key)
    reward_model = record.get("reward_model")
    if c.answer_key is not None:
        truth = _truth(_required(record, c.answer_key), c.answer_key)
    elif reward_model is None:
        truth = None
    elif not isinstance(reward_model, dict):
        raise BadRow(f"'reward_model' must be an object, got {type(reward_model).__name__}")
    else:
        value = reward_model.get("ground_truth")
        truth = None if value is None else _truth(value, "reward_model.ground_truth")
    extra = {k: v for k, v in record.items() if k not in (c.prompt_key, "data_source")}
    return PromptRow(index, prompt, truth, str(record.get("data_source", "unknown")), extra)


def _gsm8k(record, index, c: Columns) -> PromptRow:
    question = _required(record, "question")
    answer = _required(record, "answer")
    if not isinstance(question, str) or not question.strip():
        raise BadRow("'question' must be a non-empty string")
    if not isinstance(answer, str):
        raise BadRow(f"'answer' must be a string, got {type(answer).__name__}")
    truth = find_gsm8k_answer(answer)
    if truth is None:
        raise BadRow("'answer' has no '#### <number>' final answer")
    extra = {k: v for k, v in record.items() if k != "question"}
    return PromptRow(index, question, truth, GSM8K_SOURCE, extra)


_CONVERTERS = {"seed": _seed, "trl": _trl, "verl": _verl, "gsm8k": _gsm8k}


def _required(record: dict, key: str) -> Any:
    if key not in record or record[key] is None:
        raise BadRow(f"missing {key!r}")
    return record[key]


def _truth(value: Any, key: str) -> str:
    """Ground truths are strings; numbers are formatted, structures kept as JSON."""
    if isinstance(value, str):
        return value.strip()
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, (int, float)):
        return str(int(value)) if float(value).is_integer() else str(value)
    if isinstance(value, (list, dict)):
        return json.dumps(value, ensure_ascii=False)
    raise BadRow(f"{key!r} must be a string or number, got {type(value).__name__}")


def _prompt(record: dict, key: str, *, answerable: bool = True) -> str | list[dict[str, str]]:
    """The prompt column: a non-empty string or a list of {role, content} string messages
    with known roles and non-empty content; ``answerable``: holding a user message and
    not ending with the assistant's (else the model has nothing to answer)."""
    value = _required(record, key)
    if isinstance(value, str):
        if not value.strip():
            raise BadRow(f"{key!r} is an empty string")
        return value
    if not isinstance(value, (list, tuple)):
        raise BadRow(
            f"{key!r} must be a string or a list of chat messages, got {type(value).__name__}"
        )
    if not value:
        raise BadRow(f"{key!r} is an empty message list")
    messages = []
    for i, msg in enumerate(value):
        if not isinstance(msg, dict) or not isinstance(msg.get("role"), str):
            raise BadRow(f"{key}[{i}] must be an object with string 'role' and 'content'")
        if msg["role"] not in CHAT_ROLES:  # it would go into the template as written
            raise BadRow(
                f"{key}[{i}] has the role {msg['role'][:40]!r}; a chat message is "
                f"one of {', '.join(CHAT_ROLES)}"
            )
        if not isinstance(msg.get("content"), str):
            raise BadRow(
                f"{key}[{i}] ({msg['role']}) needs a string 'content', "
                f"got {type(msg.get('content')).__name__}"
            )
        if not msg["content"].strip():
            raise BadRow(f"{key}[{i}] ({msg['role']}) has an empty 'content'")
        messages.append({"role": msg["role"], "content": msg["content"]})
    asks = any(m["role"] == "user" for m in messages) and messages[-1]["role"] != "assistant"
    if answerable and not asks:
        raise BadRow(
            f"{key} must hold a user message and end with one (or a tool result) for "
            "the model to answer; it has " + " -> ".join(m["role"] for m in messages)
        )
    return messages


@dataclass
class LoadResult:
    """What :func:`load_prompt_rows` read: the good rows and what was left out."""

    rows: list[PromptRow]
    format: str  # the format used (auto resolved to a concrete one)
    n_bad: int = 0  # rows skipped with on_bad_row=skip
    bad_rows_path: Path | None = None  # where the skipped rows were written


def load_prompt_rows(
    source: str, columns: Columns = Columns(), read: ReadOptions = ReadOptions()
) -> LoadResult:
    """Read ``source`` (see :func:`danka.data.files.read_records`) and convert its rows.

    Bad rows follow ``read.on_bad_row`` (see :func:`read_and_convert`); all rows bad ->
    UserError. ``PromptRow.index`` is the row's position among the source's parsed records.
    """
    if columns.fmt not in FORMATS:
        raise UserError(
            f"unknown data format {columns.fmt!r}",
            "data.format",
            f"use one of {', '.join(FORMATS)}",
        )
    records, bad = read_noting_bad_lines(source, read)
    c = columns
    if c.fmt == "auto":
        c = replace(c, fmt=_detect_for_file(records, source, c.prompt_key, c.response_key))
    rows = convert_records(
        source,
        records,
        lambda i, where, r: _convert(r, i, c),
        lambda err, r, where: _bad_row_error(err, r, where, c.fmt),
        read=read,
        bad=bad,
        nothing_usable=("rows", "check data.format and data.prompt_key against the file's columns"),
    )
    return LoadResult(rows, c.fmt, len(bad), read.bad_rows_path if bad else None)


def read_noting_bad_lines(
    source: str, read: ReadOptions
) -> tuple[list[tuple[str, dict]], list[dict[str, Any]]]:
    """``(records, bad)``: ``source``'s records (see :func:`danka.data.files.read_records`);
    with ``on_bad_row: skip``, lines that do not parse are left out and listed in ``bad`` as
    ``{"location", "reason", "record"}``."""
    bad_lines: list[tuple[str, str]] | None = [] if read.on_bad_row == "skip" else None
    records = read_records(
        source,
        bad_lines=bad_lines,
        base_dir=read.base_dir,
        split=read.split,
        dataset_type=read.dataset_type,
    )
    return records, [{"location": w, "reason": r, "record": None} for w, r in bad_lines or []]


def convert_records(
    source: str,
    records: list[tuple[str, dict]],
    convert: Callable[[int, str, dict], T],
    error: Callable[[BadRow, dict, str], UserError],
    *,
    read: ReadOptions,
    bad: list[dict[str, Any]],
    nothing_usable: tuple[str, str],
) -> list[T]:
    """``convert(index, location, record)`` for each record, up to ``read.limit`` good ones.
    A BadRow raises ``error(err, record, location)`` (``on_bad_row: error``), or (``skip``)
    joins ``bad``, which is then appended to ``read.bad_rows_path`` (if given). No good
    row -> UserError "no usable WHAT" with the fix ``nothing_usable = (WHAT, FIX)``."""
    out: list[T] = []
    for index, (where, record) in enumerate(records):
        if read.limit is not None and len(out) >= read.limit:
            break
        try:
            out.append(convert(index, where, record))
        except BadRow as err:
            if read.on_bad_row != "skip":
                raise error(err, record, where) from None
            bad.append({"location": where, "reason": str(err), "record": record})
    if bad and read.bad_rows_path is not None:
        write_bad_rows(bad, Path(read.bad_rows_path))
    if not out:
        what, fix = nothing_usable
        raise UserError(
            f"no usable {what}: all {len(bad)} rows are bad"
            + (f" (see {read.bad_rows_path})" if read.bad_rows_path and bad else ""),
            source,
            fix,
        )
    return out


def write_bad_rows(bad: list[dict[str, Any]], path: Path) -> None:
    """Append ``{"location", "reason", "record"}`` items to ``path`` as JSON lines."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as f:
        for item in bad:
            f.write(json.dumps(item, ensure_ascii=False, default=str) + "\n")


def _detect_for_file(records: list, source: str, prompt_key: str, response_key: str) -> str:
    """The most common detected format among the first rows (broken rows don't vote)."""
    votes = Counter(
        f
        for _, r in records[:_DETECT_ROWS]
        if (f := detect_format(r, prompt_key=prompt_key, response_key=response_key))
    )
    if votes:
        return votes.most_common(1)[0][0]
    where, first = records[0] if records else (source, {})
    raise UserError(
        f"cannot detect the data format: no {prompt_key!r} column (seed/trl/verl) and no "
        f"'question'+'answer' (gsm8k); the first row has keys {sorted(first)}",
        where,
        "set data.prompt_key to the column holding the prompt, or data.format",
    )
