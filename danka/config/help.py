"""``danka train --help-config``: every config key with its type, default and help text."""

from __future__ import annotations

import dataclasses
import typing

from danka.config.load import _type_name
from danka.schema.sections import DankaConfig


def _default(f: dataclasses.Field) -> object:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


def _fmt(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if value == "":
        return '""'
    return str(value)


def config_rows(cls: type = DankaConfig, prefix: str = "") -> list[tuple[str, str, str, str]]:
    """(dotted key, type, default, help) for every leaf key of the config, in file order."""
    rows = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        key = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(tp):
            rows.extend(config_rows(tp, key + "."))
        elif typing.get_origin(tp) is list and dataclasses.is_dataclass(typing.get_args(tp)[0]):
            rows.append((key, "list", "[]", f.metadata.get("help", "")))
            rows.extend(config_rows(typing.get_args(tp)[0], key + "[i]."))
        else:
            rows.append((key, _type_name(tp), _fmt(_default(f)), f.metadata.get("help", "")))
    return rows


def config_help() -> str:
    """The text ``--help-config`` prints: one block per section."""
    lines, section = [], None
    for key, tp, default, help_text in config_rows():
        top = key.split(".")[0] if "." in key else ""
        if top != section:
            section = top
            lines.append(f"\n{top or '(top level)'}:")
        lines.append(f"  {key}  ({tp}, default {default})\n      {help_text}")
    return "\n".join(lines).lstrip("\n") + "\n"
