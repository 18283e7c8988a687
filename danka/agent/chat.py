"""Prompts that offer tools, and the tokens of the turns the loop inserts.

Two ways to show the tool schemas, picked once per tokenizer:

* the tokenizer's chat template renders ``tools=`` (Qwen2.5/3, Llama 3.1, Hermes ...):
  the schemas go through it, and tool results are messages with role ``tool``;
* otherwise (e.g. SmolLM2's plain ChatML template) the documented default: the system
  message gets :data:`DEFAULT_TOOL_SYSTEM` (the Hermes/Qwen2.5 wording: the JSON schemas
  inside ``<tools></tools>`` and the ``<tool_call>`` format), and each tool result is a
  ``user`` message ``<tool_response>\\n...\\n</tool_response>`` (as Qwen2.5's template
  renders role ``tool``).

The text inserted after a model turn (tool responses, or an environment's observation,
then the next assistant header) is the difference between the template rendering a
conversation with and without the new messages, so it matches what the template would
produce for the whole conversation. Without a chat template, plain ChatML is used.
"""

from __future__ import annotations

import json
from typing import Any

DEFAULT_TOOL_SYSTEM = """# Tools

You may call one or more functions to assist with the user query.

You are provided with function signatures within <tools></tools> XML tags:
<tools>
{schemas}
</tools>

For each function call, return a json object with function name and arguments within \
<tool_call></tool_call> XML tags:
<tool_call>
{{"name": <function-name>, "arguments": <args-json-object>}}
</tool_call>"""

_SENTINEL = "\u2063DANKA_TURN\u2063"
_PROBE_TOOL = {
    "type": "function",
    "function": {
        "name": "danka_probe_tool",
        "description": "probe",
        "parameters": {"type": "object", "properties": {}},
    },
}
_CHATML = "<|im_start|>{role}\n{content}<|im_end|>\n"


# SmolLM2-Instruct's own wording (its SFT data, argilla/Synth-APIGen): a JSON *list* of
# calls inside one <tool_call> block, which parse.py accepts.
SMOLLM_TOOL_SYSTEM = """You are an expert in composing functions. You are given a question \
and a set of possible functions.
Based on the question, you will need to make one or more function/tool calls to achieve \
the purpose.
If none of the functions can be used, point it out and refuse to answer.
If the given question lacks the parameters required by the function, also point it out.

You have access to the following tools:
<tools>{schemas}</tools>

The output MUST strictly adhere to the following format, and NO other text MUST be \
included.
The example format is as follows. Please make sure the parameter type is correct. If no \
function call is needed, please make the tool calls an empty list '[]'.
<tool_call>[
{{"name": "func_name1", "arguments": {{"argument1": "value1", "argument2": "value2"}}}},
... (more tool calls as required)
]</tool_call>"""

# agent.tool_prompt: a name here, or the user's own text with {schemas}
TOOL_PROMPTS = {"hermes": DEFAULT_TOOL_SYSTEM, "smollm": SMOLLM_TOOL_SYSTEM}
DEFAULT_TOOL_PROMPT = "auto"


def check_tool_prompt(value: str) -> None:
    """``auto``, a name of :data:`TOOL_PROMPTS`, or a text holding ``{schemas}``."""
    from danka.errors import UserError
    from danka.limits import check_template

    if value == "auto" or value in TOOL_PROMPTS:
        return
    why = ""
    try:  # its fields and format specs bounded, as every template's (danka.limits)
        check_template("agent.tool_prompt", value, ["schemas"])
        ok = "{schemas}" in value
    except UserError as err:
        ok, why = False, f" ({err.what.rsplit('cannot be filled: ', 1)[-1]})"
    if not ok:
        raise UserError(
            f"agent.tool_prompt {value[:60]!r} is neither a known name nor a text with "
            f"{{schemas}}{why}",
            where="agent.tool_prompt",
            fix=f"use auto, one of {', '.join(TOOL_PROMPTS)}, or your own system text with "
            "{schemas} where the tool schemas go (double any other { and })",
        )


def default_tool_system(schemas: list[dict[str, Any]], tool_prompt: str = "hermes") -> str:
    """The system text of ``tool_prompt`` (a name or a text) listing ``schemas``."""
    text = TOOL_PROMPTS.get("hermes" if tool_prompt == "auto" else tool_prompt, tool_prompt)
    return text.format(schemas="\n".join(json.dumps(s) for s in schemas))


class ChatFormat:
    """Renders prompts with tools and the inserted turns for one tokenizer."""

    def __init__(
        self,
        tokenizer: Any,
        tool_prompt: str = DEFAULT_TOOL_PROMPT,
        demo: list[dict[str, str]] | None = None,
    ):
        check_tool_prompt(tool_prompt)
        self.tokenizer, self.tool_prompt = tokenizer, tool_prompt
        self.demo = list(demo or [])  # worked examples (demo.py): user/assistant/tool turns
        self.templated = bool(getattr(tokenizer, "chat_template", None))
        # auto: the template's own tool format when it has one; a named or own text wins
        self.native_tools = tool_prompt == "auto" and self.templated and self._renders_tools()

    def _render(self, messages: list[dict], *, tools=None, generation_prompt=False) -> str:
        if not self.templated:
            text = "".join(_CHATML.format(**m) for m in messages)
            return text + ("<|im_start|>assistant\n" if generation_prompt else "")
        kw = {"tools": tools} if tools else {}
        return self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=generation_prompt, **kw
        )

    def _renders_tools(self) -> bool:
        try:
            text = self._render([{"role": "user", "content": "hi"}], tools=[_PROBE_TOOL])
        except Exception:  # noqa: BLE001 - a template that refuses tools= does not support it
            return False
        return "danka_probe_tool" in text

    def prompt_messages(self, messages: list[dict], schemas: list[dict]) -> list[dict]:
        """``messages`` offering ``schemas``: the tool system text merged in (unless the
        template renders the tools), then the worked examples after the system message."""
        out = [dict(m) for m in messages]
        if not schemas:
            return out
        if not self.native_tools:
            text = default_tool_system(schemas, self.tool_prompt)
            if out and out[0]["role"] == "system":
                out[0]["content"] = f"{out[0]['content']}\n\n{text}"
            else:
                out.insert(0, {"role": "system", "content": text})
        at = 1 if out and out[0]["role"] == "system" else 0
        demo = [
            self.tool_message(m["content"]) if m["role"] == "tool" else dict(m) for m in self.demo
        ]
        return out[:at] + demo + out[at:]

    def prompt(self, messages: list[dict], schemas: list[dict]) -> str:
        """The prompt text offering ``schemas``, ending with the assistant header."""
        msgs = self.prompt_messages(messages, schemas)
        tools = schemas if (schemas and self.native_tools) else None
        return self._render(msgs, tools=tools, generation_prompt=True)

    def tool_message(self, content: str) -> dict[str, str]:
        """A tool result as a chat message, in this tokenizer's convention."""
        if self.native_tools:
            return {"role": "tool", "content": content}
        return {"role": "user", "content": f"<tool_response>\n{content}\n</tool_response>"}

    def continuation(self, new_messages: list[dict], end_of_turn: str) -> str:
        """Text to append after a model turn that ended with ``end_of_turn`` (its EOS
        token's text) so that ``new_messages`` follow and the next assistant turn opens."""
        base = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": _SENTINEL}]
        before = self._render(base)
        after = self._render(base + new_messages, generation_prompt=True)
        tail = before.split(_SENTINEL, 1)[1]  # what closes the assistant turn, e.g. "<|im_end|>\n"
        if not after.startswith(before):  # a template that rewrites earlier turns
            before, after = "", "".join(_CHATML.format(**m) for m in new_messages)
            after += "<|im_start|>assistant\n"
            tail = "<|im_end|>\n"
        rest = tail[len(end_of_turn) :] if end_of_turn and tail.startswith(end_of_turn) else tail
        return rest + after[len(before) :]
