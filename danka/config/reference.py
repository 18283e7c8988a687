"""The config key reference (``docs/config.md``), generated from the schema's help text.

    python -m danka.config.reference docs/config.md     # write it
    python -m danka.config.reference                    # print it

One Markdown section per top-level section of the config (whatever dataclass sections the
schema has), each a table of its keys: dotted key, type, default and help text, in schema
order, from the same rows ``danka train --help-config`` prints
(:func:`danka.config.help.config_rows`). A test fails when ``docs/config.md`` is stale.
"""

from __future__ import annotations

import dataclasses
import sys
import typing
from pathlib import Path

from danka.config.help import config_rows
from danka.schema.sections import DankaConfig

REGENERATE = "python -m danka.config.reference docs/config.md"
TOP_LEVEL = "top level"

INTRO = """\
# Config keys

Every key of a danka config, with its type, its default and what it does. Set a key in the
YAML file under its section, or on the command line as `section.key=value` (after the config
file: `danka train my.yaml optim.lr=1e-5`). Unknown keys, wrong types and inconsistent
batch sizes are refused before any model loads, with the nearest valid key in the message.
`danka train CONFIG --print-config` shows the resolved values of a config;
`danka train --help-config` prints this list in the terminal.

This page is generated from the schema's help text (`danka/schema/sections.py`); do not edit
it by hand, run `{regenerate}`.
"""


def _section_doc(cls: type) -> str:
    """The section dataclass's own docstring (not the signature dataclasses make up)."""
    doc = (cls.__doc__ or "").strip()
    return "" if doc.startswith(f"{cls.__name__}(") else " ".join(doc.split())


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def sections(cls: type = DankaConfig) -> list[tuple[str, str, list[tuple[str, str, str, str]]]]:
    """(section name, section docstring, its rows) per top-level section, in schema order;
    plain top-level keys are gathered in one section, ``top level``, first."""
    hints = typing.get_type_hints(cls)
    every = config_rows(cls)
    plain: list[tuple[str, str, str, str]] = []
    out: list[tuple[str, str, list[tuple[str, str, str, str]]]] = []
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            out.append((f.name, _section_doc(tp), config_rows(tp, f"{f.name}.")))
        else:
            plain.extend(row for row in every if row[0] == f.name)
    return ([(TOP_LEVEL, "", plain)] if plain else []) + out


def render(cls: type = DankaConfig) -> str:
    """The Markdown reference of every key of ``cls``."""
    parts = sections(cls)
    lines = [
        INTRO.format(regenerate=REGENERATE),
        "Sections: "
        + ", ".join(f"[{name}](#{name.replace(' ', '-')})" for name, _, _ in parts)
        + ".",
        "",
    ]
    for name, doc, rows in parts:
        lines += [f"## {name}", ""]
        if doc:
            lines += [doc, ""]
        lines += ["| key | type | default | what it does |", "|---|---|---|---|"]
        for key, tp, default, help_text in rows:
            lines.append(f"| `{key}` | {_cell(tp)} | `{_cell(default)}` | {_cell(help_text)} |")
        lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    text = render()
    if argv:
        Path(argv[0]).write_text(text)
        print(f"wrote {argv[0]}")
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
