"""docs/config.md is the schema's help text rendered by danka.config.reference, and stays so."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from danka.config.help import config_rows
from danka.config.reference import REGENERATE, render, sections

DOC = Path(__file__).resolve().parents[2] / "docs" / "config.md"


def test_docs_config_md_is_up_to_date():
    assert DOC.read_text() == render(), f"docs/config.md is stale: run `{REGENERATE}`"


def test_every_key_of_the_schema_is_in_the_reference():
    text = render()
    missing = [key for key, *_ in config_rows() if f"| `{key}` |" not in text]
    assert missing == []


@dataclass
class _Inner:
    depth: int = field(default=2, metadata={"help": "how deep"})


@dataclass
class _Speed:
    """How fast it goes."""

    fused: bool = field(default=True, metadata={"help": "on | off"})
    inner: _Inner = field(default_factory=_Inner)


@dataclass
class _Sampling:
    temperature: float = field(default=1.0, metadata={"help": "softmax temperature"})


@dataclass
class _Config:
    sampling: _Sampling = field(default_factory=_Sampling)
    output_dir: str = field(default="out", metadata={"help": "where it goes"})
    speed: _Speed = field(default_factory=_Speed)


def test_any_dataclass_sections_render_one_table_each():
    names = [name for name, _, _ in sections(_Config)]
    assert names == ["top level", "sampling", "speed"]  # plain keys first, then schema order
    text = render(_Config)
    assert "## speed\n\nHow fast it goes.\n" in text  # a section's own docstring
    assert "## sampling\n\n| key |" in text  # none: no made-up signature text
    assert "| `speed.inner.depth` | int | `2` | how deep |" in text  # nested sections flatten
    assert "| `speed.fused` | bool | `true` | on \\| off |" in text  # a pipe cannot end a cell
    assert "| `output_dir` | str | `out` | where it goes |" in text
