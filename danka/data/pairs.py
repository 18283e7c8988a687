"""Preference pairs (a chosen and a rejected answer to one prompt) for reward-model training.

Layouts (column names configurable, as OpenRLHF's ``--chosen_key/--rejected_key/--prompt_key``):

- TRL, explicit prompt: ``{"prompt": P, "chosen": C, "rejected": R}``; ``P`` is text or chat
  messages, ``C``/``R`` text or the assistant message(s).
- TRL, implicit prompt: ``{"chosen": C, "rejected": R}`` where both hold the whole text or
  conversation; the prompt is their longest shared prefix (TRL's ``extract_prompt``: per
  character for text, per message for conversations), the answers are the rest.
- an optional ``margin`` column (a number): the pair's loss becomes
  ``-log sigmoid(r_c - r_r - margin)``.

A bad pair (a missing or wrongly typed column, an empty answer, chosen == rejected, a
margin that is not a number) follows ``on_bad_row`` like prompt rows do: ``error`` raises
a UserError naming ``file:line``; ``skip`` appends it to ``bad_rows_path`` and goes on.
"""

from __future__ import annotations

from dataclasses import dataclass

from danka.data.formats import (
    BadRow,
    ReadOptions,
    _prompt,
    convert_records,
    read_noting_bad_lines,
)
from danka.errors import UserError

Text = str | list[dict[str, str]]


@dataclass
class PreferencePair:
    prompt: Text  # "" when an implicit-prompt pair shares no prefix
    chosen: Text  # the preferred answer: text, or assistant message(s)
    rejected: Text
    margin: float | None  # how much better chosen is (None: no margin)
    location: str  # file:line, for messages


def _empty(value: Text) -> bool:
    if isinstance(value, str):
        return not value.strip()
    return not value or all(not m["content"].strip() for m in value)


def split_shared_prefix(chosen: Text, rejected: Text) -> tuple[Text, Text, Text]:
    """``(prompt, chosen_rest, rejected_rest)``: the longest shared prefix of two texts (by
    character) or two conversations (by message), as TRL's ``extract_prompt``; a space just
    before the split stays with the answers."""
    if type(chosen) is not type(rejected):
        raise BadRow("chosen and rejected must both be text or both be chat messages")
    n = min(len(chosen), len(rejected))
    idx = next((i for i in range(n) if chosen[i] != rejected[i]), n)
    if isinstance(chosen, str) and 0 < idx and chosen[idx - 1] == " ":
        idx -= 1
    return chosen[:idx], chosen[idx:], rejected[idx:]


@dataclass(frozen=True)
class PairColumns:
    """Which column holds what in a pairs file (``rm.*_key``, ``data.prompt_key``)."""

    chosen_key: str = "chosen"
    rejected_key: str = "rejected"
    prompt_key: str = "prompt"  # absent or null in a row: the prompt is implicit
    margin_key: str = "margin"


def to_pair(record: dict, location: str, columns: PairColumns = PairColumns()) -> PreferencePair:
    """One record as a pair; BadRow says what is wrong with it."""
    c = columns
    chosen = _prompt(record, c.chosen_key, answerable=False)
    rejected = _prompt(record, c.rejected_key, answerable=False)
    if chosen == rejected:
        raise BadRow(f"{c.chosen_key!r} and {c.rejected_key!r} are identical")
    implicit = record.get(c.prompt_key) is None
    if implicit:
        prompt, chosen, rejected = split_shared_prefix(chosen, rejected)
    else:
        prompt = _prompt(record, c.prompt_key)
    for key, value in ((c.chosen_key, chosen), (c.rejected_key, rejected)):
        if _empty(value):
            after = " after the shared prefix (the implicit prompt)" if implicit else ""
            raise BadRow(f"{key!r} is empty{after}")
    margin = record.get(c.margin_key)
    if margin is not None and (isinstance(margin, bool) or not isinstance(margin, (int, float))):
        raise BadRow(f"{c.margin_key!r} must be a number, got {type(margin).__name__}")
    return PreferencePair(
        prompt, chosen, rejected, None if margin is None else float(margin), location
    )


def load_pairs(
    source: str, columns: PairColumns = PairColumns(), read: ReadOptions | None = None
) -> tuple[list[PreferencePair], int]:
    """``(pairs, n_bad)`` from ``source`` (any file :func:`~danka.data.files.read_records`
    reads); bad pairs follow ``read.on_bad_row`` (see
    :func:`~danka.data.formats.convert_records`); all pairs bad -> UserError."""
    c, read = columns, read or ReadOptions()
    records, bad = read_noting_bad_lines(source, read)

    def error(err: BadRow, record: dict, where: str) -> UserError:
        return UserError(
            f"bad preference pair: {err}; the row has keys {sorted(record)}",
            where,
            f"fix or remove the row, set rm.chosen_key / rm.rejected_key / "
            f"data.prompt_key to the file's columns (now {c.chosen_key!r}, "
            f"{c.rejected_key!r}, {c.prompt_key!r}), or set data.on_bad_row: skip",
        )

    fix = f"each row needs {c.chosen_key!r} and {c.rejected_key!r} (rm.chosen_key/rejected_key)"
    pairs = convert_records(
        source,
        records,
        lambda i, where, record: to_pair(record, where, c),
        error,
        read=read,
        bad=bad,
        nothing_usable=("preference pairs", fix),
    )
    return pairs, len(bad)
