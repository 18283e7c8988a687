from danka.agent.chat import ChatFormat
from danka.agent.tools import load_tool
from danka.models.tiny import tiny_tokenizer

# A minimal tools-aware template in Qwen2.5's style: tools in the system turn, tool
# results as a user turn wrapped in <tool_response>.
TOOLS_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\nTOOLS:{% for t in tools %}{{ t.function.name }};"
    "{% endfor %}<|im_end|>\n{% endif %}"
    "{% for m in messages %}{% if m.role == 'tool' %}<|im_start|>user\n<tool_response>\n"
    "{{ m.content }}\n</tool_response><|im_end|>\n{% else %}<|im_start|>{{ m.role }}\n"
    "{{ m.content }}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
USER = [{"role": "user", "content": "What is 2 * 3?"}]


def test_template_with_native_tools():
    tok = tiny_tokenizer()
    tok.chat_template = TOOLS_TEMPLATE
    chat = ChatFormat(tok)
    schema = load_tool("calculator").schema
    assert chat.native_tools
    assert chat.prompt(USER, [schema]) == (
        "<|im_start|>system\nTOOLS:calculator;<|im_end|>\n"
        "<|im_start|>user\nWhat is 2 * 3?<|im_end|>\n<|im_start|>assistant\n"
    )
    assert chat.tool_message("6") == {"role": "tool", "content": "6"}
    assert chat.continuation([chat.tool_message("6")], "<|im_end|>") == (
        "\n<|im_start|>user\n<tool_response>\n6\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_plain_chatml_gets_the_default_tool_system_text():
    chat = ChatFormat(tiny_tokenizer())
    schema = load_tool("calculator").schema
    assert not chat.native_tools
    msgs = chat.prompt_messages([{"role": "system", "content": "Be brief."}, *USER], [schema])
    assert msgs[0]["content"].startswith("Be brief.\n\n# Tools")  # merged, not a 2nd system
    assert '"name": "calculator"' in msgs[0]["content"] and len(msgs) == 2
    assert chat.tool_message("6") == {
        "role": "user",
        "content": "<tool_response>\n6\n</tool_response>",
    }
    assert chat.prompt(USER, []).startswith("<|im_start|>system\nYou are a helpful assistant.")


def test_tool_prompt_picks_the_system_text():
    import pytest

    from danka.agent.chat import SMOLLM_TOOL_SYSTEM
    from danka.errors import UserError

    schema = load_tool("calculator").schema
    smol = ChatFormat(tiny_tokenizer(), "smollm").prompt_messages(USER, [schema])[0]["content"]
    assert smol.startswith(SMOLLM_TOOL_SYSTEM.split("{schemas}")[0])
    assert '<tools>{"type": "function", "function": {"name": "calculator"' in smol
    own = ChatFormat(tiny_tokenizer(), "Tools: {schemas}. Call with <tool_call>.")
    assert own.prompt_messages(USER, [schema])[0]["content"].startswith('Tools: {"type"')
    # a tools-aware template is used under auto, and overridden by a named text
    tok = tiny_tokenizer()
    tok.chat_template = TOOLS_TEMPLATE
    assert ChatFormat(tok, "auto").native_tools and not ChatFormat(tok, "hermes").native_tools
    forced = ChatFormat(tok, "hermes")
    assert forced.prompt_messages(USER, [schema])[0]["content"].startswith("# Tools")
    assert forced.tool_message("6")["role"] == "user"
    for bad in ("hermez", "no placeholder", "{schemas} {other}"):
        with pytest.raises(UserError, match="agent.tool_prompt"):
            ChatFormat(tok, bad)
