"""Tools as plain Python functions (TRL's convention).

A tool is a function with type hints and a Google-style docstring whose ``Args:`` section
describes every parameter; its JSON schema (OpenAI/HF "function" format, the one chat
templates take as ``tools=``) comes from ``transformers.utils.get_json_schema``. Configured
as ``rollout.tools: [calculator, python, path/to/file.py:function]``: a builtin name or a
function in a file the config names (relative paths resolve against the config's folder).
The function is loaded here once to build its schema, and again inside the tool worker
(worker.py), which runs the calls.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from danka.agent.builtins import BUILTIN_TOOLS
from danka.errors import UserError


@dataclass(frozen=True)
class ToolSpec:
    """One tool: how the worker finds it, and the schema the model sees."""

    name: str  # the function name the model calls
    source: str  # "builtin" or the absolute path of the .py file
    function: str  # attribute name (the builtin's name for builtins)
    schema: dict[str, Any] = field(compare=False)  # {"type": "function", "function": {...}}
    fn: Callable[..., Any] = field(compare=False, repr=False)

    def check_arguments(self, arguments: dict[str, Any]) -> str | None:
        """Why ``arguments`` do not fit the signature (missing/unknown names), or None."""
        try:
            inspect.signature(self.fn).bind(**arguments)
        except TypeError as exc:
            return f"bad arguments for {self.name}: {exc}"
        except ValueError:
            return None
        return None


def tool_schema(fn: Callable[..., Any], where: str) -> dict[str, Any]:
    """The JSON schema of ``fn`` from its type hints and Google-style docstring."""
    from transformers.utils import get_json_schema

    try:
        return get_json_schema(fn)
    except Exception as exc:  # noqa: BLE001 - transformers raises several exception types
        raise UserError(
            f"cannot build a tool schema for {getattr(fn, '__name__', fn)!r}: {exc}",
            where=where,
            fix="give the function type hints for every argument and a Google-style "
            "docstring: a description line, then 'Args:' with one 'name: description' "
            "line per argument",
        ) from exc


def load_tool(spec: str, base_dir: Path | str = ".") -> ToolSpec:
    """A builtin name (``calculator``, ``python``) or ``path/to/file.py:function``."""
    from danka.rewards.custom import load_function_from_file

    if spec in BUILTIN_TOOLS:
        fn = BUILTIN_TOOLS[spec]
        return ToolSpec(spec, "builtin", spec, tool_schema(fn, f"builtin tool {spec}"), fn)
    file, sep, function = str(spec).rpartition(":")
    if not sep or not file.endswith(".py") or not function.isidentifier():
        raise UserError(
            f"unknown tool {spec!r}",
            where="rollout.tools",
            fix=f"use a builtin ({', '.join(sorted(BUILTIN_TOOLS))}) or path/to/file.py:function",
        )
    path = Path(file).expanduser()
    path = (path if path.is_absolute() else Path(base_dir) / path).resolve()
    fn = load_function_from_file(path, function)
    return ToolSpec(function, str(path), function, tool_schema(fn, f"{path}:{function}"), fn)


def load_tools(specs: list[str], base_dir: Path | str = ".") -> list[ToolSpec]:
    """Every configured tool; UserError on a bad spec or two tools with the same name."""
    tools = [load_tool(s, base_dir) for s in specs]
    names = [t.name for t in tools]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise UserError(
            f"two tools are named {dup[0]!r}", where="rollout.tools", fix="rename one function"
        )
    return tools
