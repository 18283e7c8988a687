"""Worked examples shown before every prompt that offers tools (``agent.tool_demo``).

A small instruct model rarely writes a ``<tool_call>`` from a system text alone
(SmolLM2-135M-Instruct: 0 valid calls in 32 sampled answers), so reinforcement learning
never sees a call to reward. A few earlier turns that show the whole exchange (question,
``<tool_call>``, ``<tool_response>``, answer) make the untrained model imitate it
(measured in BENCHMARKS.md, "Calculator tool: prompt design").

``agent.tool_demo``:

* ``auto``: the builtin examples of every offered builtin tool that has some (the
  ``calculator``: three multiplications/divisions, results computed by the tool itself),
  each question ending with ``data.instruction`` like the real prompts (a 135M model
  copies the exchange only when the questions look alike: without it, 0 of 32 answers
  called the tool); nothing for your own tools;
* ``none``: no examples;
* ``path/to/demo.json``: your own, a JSON list of messages ``{"role", "content"}`` with
  roles ``user``, ``assistant`` (calls written as ``<tool_call>...</tool_call>`` text) and
  ``tool`` (a result; rendered in the tokenizer's tool-response convention).

The examples sit between the system message and the conversation; they are part of the
prompt (never trained on, never scored).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from danka.errors import UserError
from danka.safe_read import MAX_CONFIG_BYTES, read_json

# builtin tool -> (question, arguments) of each example; the tool computes the result
BUILTIN_DEMOS: dict[str, list[tuple[str, dict[str, Any]]]] = {
    "calculator": [
        ("What is 12 * 34?", {"expression": "12 * 34"}),
        ("What is 5226 / 67?", {"expression": "5226 / 67"}),
        ("What is 903 * 41?", {"expression": "903 * 41"}),
    ],
}
ROLES = ("user", "assistant", "tool")


def call_text(name: str, arguments: dict[str, Any]) -> str:
    """An assistant turn calling ``name`` (the Hermes/Qwen format parse.py reads)."""
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def builtin_demo(tool_names: list[str], instruction: str | None = None) -> list[dict[str, str]]:
    """The examples of the offered builtin tools, in the order the tools were given; each
    question ends with ``instruction`` (data.instruction) as the real prompts do."""
    from danka.agent.builtins import BUILTIN_TOOLS

    out: list[dict[str, str]] = []
    for name in tool_names:
        for question, arguments in BUILTIN_DEMOS.get(name, []):
            result = str(BUILTIN_TOOLS[name](**arguments))
            out += [
                {
                    "role": "user",
                    "content": f"{question} {instruction}" if instruction else question,
                },
                {"role": "assistant", "content": call_text(name, arguments)},
                {"role": "tool", "content": result},
                {"role": "assistant", "content": result},
            ]
    return out


def load_demo(
    spec: str, tool_names: list[str], base_dir: Path | str = ".", instruction: str | None = None
) -> list[dict]:
    """The messages of ``agent.tool_demo`` (see the module docstring); UserError on a
    bad file. ``instruction`` (data.instruction) ends the builtin examples' questions."""
    if spec == "none":
        return []
    if spec == "auto":
        return builtin_demo(tool_names, instruction)
    path = Path(spec) if Path(spec).is_absolute() else Path(base_dir) / spec
    fix = 'a JSON list of {"role": "user" | "assistant" | "tool", "content": "..."}'
    if not path.exists() and not path.is_symlink():
        raise UserError(
            "tool demo file not found",
            where=f"agent.tool_demo: {path}",
            fix=f"auto, none or {fix}",
        )
    messages = read_json(path, limit=MAX_CONFIG_BYTES, what="the tool demo", fix=fix)
    if not isinstance(messages, list) or not messages:
        raise UserError("the tool demo must be a non-empty JSON list", where=str(path), fix=fix)
    for i, m in enumerate(messages):
        ok = isinstance(m, dict) and m.get("role") in ROLES and isinstance(m.get("content"), str)
        if not ok:
            raise UserError(
                f"message {i} is not a {{role, content}} pair", where=str(path), fix=fix
            )
    return [{"role": m["role"], "content": m["content"]} for m in messages]
