import pytest

from danka.agent.setup import build_agent_loop, check_agent_config
from danka.errors import UserError
from danka.models.tiny import tiny_tokenizer
from danka.schema.sections import AgentConfig


def test_no_tools_no_loop_and_a_tool_loop_from_config():
    tok = tiny_tokenizer()
    assert build_agent_loop(AgentConfig(), tok, base_dir=".", max_new_tokens=64) is None
    cfg = AgentConfig(tools=["calculator"], max_turns=2, max_total_tokens=300)
    loop = build_agent_loop(cfg, tok, base_dir=".", max_new_tokens=64)
    assert loop.limits.max_turns == 2 and loop.limits.max_total_tokens == 300
    assert [s["function"]["name"] for s in loop.schemas] == ["calculator"]
    cfg.max_total_tokens = 0  # 0 = the single-turn budget
    loop2 = build_agent_loop(cfg, tok, base_dir=".", max_new_tokens=64)
    assert loop2.limits.max_total_tokens == 64
    loop.close()
    loop2.close()


def test_tool_loop_outside_training_and_prompt_messages():
    from danka.agent.setup import prompt_messages
    from danka.types import PromptRow

    cfg = AgentConfig(tools=["calculator"], max_turns=2)
    loop = build_agent_loop(cfg, tiny_tokenizer(), base_dir=".", max_new_tokens=32)
    assert loop.limits.max_total_tokens == 32 and loop.limits.max_turns == 2
    loop.close()
    rows = [PromptRow(0, "What is 2 * 3?")]
    assert prompt_messages(rows, system_prompt="S", instruction="Use the tool.") == [
        [
            {"role": "system", "content": "S"},
            {"role": "user", "content": "What is 2 * 3? Use the tool."},
        ]
    ]


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"tools": ["calculator"], "environment": "e.py:E"}, "both set"),
        ({"max_turns": 0}, "max_turns must be >= 1"),
        ({"tool_timeout_s": 0.0}, "tool_timeout_s must be > 0"),
        ({"max_total_tokens": 10}, "below the per-turn"),
        ({"tool_prompt": "Use the tools."}, "neither a known name nor a text with"),  # no {schemas}
        ({"tool_prompt": "{schemas} {oops}"}, "neither a known name nor a text with"),  # bad braces
    ],
)
def test_bad_agent_settings_are_refused(changes, message):
    with pytest.raises(UserError, match=message):
        check_agent_config(AgentConfig(**changes), max_new_tokens=64)
