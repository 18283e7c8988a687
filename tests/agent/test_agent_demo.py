import json

import pytest

from danka.agent.chat import ChatFormat
from danka.agent.demo import load_demo
from danka.agent.tools import load_tool
from danka.errors import UserError
from danka.models.tiny import tiny_tokenizer

CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "%s"}}\n</tool_call>'


def test_auto_is_the_builtin_calculator_examples_with_computed_results():
    demo = load_demo("auto", ["calculator"])
    # 3 examples x (question, call, result, answer); 12 * 34 = 408, 5226 / 67 = 78
    assert len(demo) == 12 and [m["role"] for m in demo[:4]] == [
        "user",
        "assistant",
        "tool",
        "assistant",
    ]
    assert demo[:4] == [
        {"role": "user", "content": "What is 12 * 34?"},
        {"role": "assistant", "content": CALL % "12 * 34"},
        {"role": "tool", "content": "408"},
        {"role": "assistant", "content": "408"},
    ]
    assert demo[6]["content"] == "78"
    # phrased like the real prompts: data.instruction ends every example question
    asked = load_demo("auto", ["calculator"], instruction="Use the calculator.")
    assert [m["content"] for m in asked if m["role"] == "user"] == [
        "What is 12 * 34? Use the calculator.",
        "What is 5226 / 67? Use the calculator.",
        "What is 903 * 41? Use the calculator.",
    ]
    assert load_demo("auto", ["python"]) == [] and load_demo("none", ["calculator"]) == []


def test_demo_file_and_its_errors(tmp_path):
    good = [{"role": "user", "content": "q"}, {"role": "tool", "content": "r"}]
    (tmp_path / "d.json").write_text(json.dumps(good))
    assert load_demo("d.json", [], tmp_path) == good
    (tmp_path / "bad.json").write_text('[{"role": "robot", "content": "x"}]')
    for spec, message in [("missing.json", "not found"), ("bad.json", "message 0")]:
        with pytest.raises(UserError, match=message):
            load_demo(spec, [], tmp_path)


def test_chat_format_puts_the_examples_between_system_and_question():
    demo = load_demo("auto", ["calculator"])[:4]
    chat = ChatFormat(tiny_tokenizer(), "hermes", demo)
    schema = load_tool("calculator").schema
    msgs = chat.prompt_messages([{"role": "user", "content": "What is 2 * 3?"}], [schema])
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user", "assistant", "user"]
    assert msgs[0]["content"].startswith("# Tools")
    assert msgs[3]["content"] == "<tool_response>\n408\n</tool_response>"  # tool -> ChatML user
    assert msgs[-1]["content"] == "What is 2 * 3?"
    assert chat.prompt_messages(msgs[-1:], []) == msgs[-1:]  # no tools offered: no examples
