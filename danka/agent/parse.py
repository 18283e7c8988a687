"""Parsing tool calls out of an assistant turn, Hermes/Qwen style::

    some text <tool_call>
    {"name": "calculator", "arguments": {"expression": "12 * 34"}}
    </tool_call>

Every ``<tool_call>`` block gives one :class:`ToolCall` (a block holding a JSON list of
calls, as SmolLM2-Instruct was trained to write, gives one per item); a body that is not
a JSON object with a string ``name`` and an object ``arguments`` (``parameters`` is
accepted as an alias, and ``arguments`` may be a JSON string holding an object, as some
models write) gives a call with ``error`` set, which the loop answers with an error
message and counts as an invalid call. An opening tag without its closing tag (the turn was cut, or the model
forgot it) is parsed up to the end of the text and, if its JSON is valid, accepted.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

_BLOCK = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)


@dataclass
class ToolCall:
    """One parsed call. ``error`` is None for a well-formed call."""

    name: str | None
    arguments: dict[str, Any] = field(default_factory=dict)
    raw: str = ""  # the text between the tags
    error: str | None = None  # why the block is not a valid call

    @property
    def ok(self) -> bool:
        return self.error is None

    def as_message_call(self) -> dict[str, Any]:
        """OpenAI/HF ``tool_calls`` entry for chat templates."""
        return {"type": "function", "function": {"name": self.name, "arguments": self.arguments}}


def _parse_block(raw: str) -> list[ToolCall]:
    body = raw.strip()
    if body.startswith("```"):  # a fenced block inside the tags
        body = body.strip("`").removeprefix("json").strip()
    try:
        obj = json.loads(body)
    except json.JSONDecodeError as exc:
        return [ToolCall(None, raw=raw, error=f"the tool call is not valid JSON ({exc.msg})")]
    if isinstance(obj, list) and obj:  # SmolLM2's format: a list of calls in one block
        return [_parse_call(item, raw) for item in obj]
    return [_parse_call(obj, raw)]


def _parse_call(obj: Any, raw: str) -> ToolCall:
    if not isinstance(obj, dict):
        return ToolCall(None, raw=raw, error="the tool call must be a JSON object")
    name = obj.get("name")
    if not isinstance(name, str) or not name:
        return ToolCall(None, raw=raw, error='the tool call has no string "name"')
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError:
            return ToolCall(name, raw=raw, error='"arguments" is a string but not JSON')
    if not isinstance(args, dict):
        return ToolCall(name, raw=raw, error='"arguments" must be a JSON object')
    return ToolCall(name, args, raw=raw)


def parse_tool_calls(text: str) -> list[ToolCall]:
    """All tool calls in ``text``, in order (empty when the turn calls no tool)."""
    return [call for m in _BLOCK.finditer(text) for call in _parse_block(m.group(1))]


def strip_tool_calls(text: str) -> str:
    """``text`` without its ``<tool_call>`` blocks (the prose the model wrote around them)."""
    return _BLOCK.sub("", text).strip()
