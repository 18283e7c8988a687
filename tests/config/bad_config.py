"""Shared by the tests that feed ``load_config`` what a new user or a red team writes
(tests/config/test_config_hostile.py, tests/reliability/test_config_input.py): the smallest
valid config, writing it, the one error loading it gives, and every key of a type, so a
setting added to the schema is checked without a test naming it."""

from __future__ import annotations

import dataclasses
import typing
from pathlib import Path

import pytest

from danka.config import load_config
from danka.errors import UserError
from danka.schema.sections import DankaConfig

BASE = """\
model:
  actor_model_name_or_path: some/model
data:
  train_dataset: rows.jsonl
trainer:
  total_steps: 2
"""


def write_config(tmp_path: Path, text: str = BASE) -> Path:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    return path


def load_error(path: Path | None, overrides: typing.Sequence[str] = ()) -> UserError:
    """The UserError loading ``path`` with ``overrides`` raises (the test fails if none)."""
    with pytest.raises(UserError) as err:
        load_config(path, list(overrides))
    return err.value


def keys_of_type(kind: type, cls: type = DankaConfig, prefix: str = "") -> list[str]:
    """Every dotted key whose type is ``kind`` (or ``kind | None``), nested sections included."""
    keys = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            keys += keys_of_type(kind, tp, f"{prefix}{f.name}.")
        elif tp is kind or kind in typing.get_args(tp):
            keys.append(f"{prefix}{f.name}")
    return keys
