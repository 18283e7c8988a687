from danka.agent.rewards import TRUNCATED, final_number, tool_answer_reward

CALL = '<tool_call>{"name": "calculator", "arguments": {"expression": "12*34"}}</tool_call>'
BAD = "<tool_call>{oops</tool_call>"


def msgs(*turns):
    out = []
    for t in turns:
        out.append({"role": "assistant", "content": t})
        out.append({"role": "user", "content": "<tool_response>\n408\n</tool_response>"})
    return out[:-1]


def test_final_answer_plus_valid_call_bonus():
    completions = [
        msgs(CALL, "The answer is 408."),  # right, 1 valid call: 1 + 0.1 * 1/1 = 1.1
        msgs(CALL, BAD, "408"),  # right, 1 of 2 calls valid: 1 + 0.1 * 1/2 = 1.05
        msgs("408"),  # right without a tool: 1.0
        msgs(CALL, "409"),  # wrong, valid call: 0 + 0.1 = 0.1
        msgs(CALL),  # ended on a call (no final answer): 0 + 0.1 = 0.1
        msgs("1,234 apples"),  # thousands separator; wrong answer: 0.0
    ]
    scores = tool_answer_reward(None, completions, ["408"] * 5 + ["1235"])
    assert [round(s, 6) for s in scores] == [1.1, 1.05, 1.0, 0.1, 0.1, 0.0]


def test_calls_in_a_cut_turn_do_not_count():
    """A turn marked truncated (no end-of-turn token) never had its calls run."""
    response = {"role": "user", "content": "<tool_response>\nerror\n</tool_response>"}

    def cut(text):
        return {"role": "assistant", "content": text, TRUNCATED: True}

    completions = [
        [cut(CALL + " and then")],  # only call cut: no calls, no answer: 0.0 (old: 0.1)
        msgs(BAD) + [response, cut(CALL)],  # 0 of 1 counted calls valid: 0.0 (old 0.1 * 1/2)
        msgs(CALL) + [response, cut("408")],  # 1 of 1 valid, cut answer right: 1 + 0.1 = 1.1
    ]
    scores = tool_answer_reward(None, completions, ["408"] * 3)
    assert [round(s, 6) for s in scores] == [0.0, 0.0, 1.1]


def test_decoded_text_fallback():
    text = CALL + "\nuser\n<tool_response>\n408\n</tool_response>\nassistant\n408"
    assert tool_answer_reward(None, [text], ["408"], valid_call_bonus=0.2) == [1.2]
    assert final_number("x = 1,234.5") == "1234.5"


def test_builtin_tool_answer_reads_the_messages_through_the_reward_worker():
    import pytest

    from danka.errors import UserError
    from danka.rewards.combine import RewardSpec, build_reward_computer
    from danka.rewards.specs import check_reward_spec
    from danka.types import PromptRow

    row = PromptRow(index=0, prompt="What is 12*34?", ground_truth="408")
    with build_reward_computer(
        [RewardSpec("tool_answer", kwargs={"valid_call_bonus": 0.2})], base_dir="."
    ) as rewards:
        turns = [msgs(CALL, BAD, "408"), None]  # an agent's turns; a plain answer has none
        out = rewards([row] * 2, ["p"] * 2, ["408", "408"], messages=turns)
        plain = rewards([row], ["p"], ["408"])
    # with the trajectory: 1 + 0.2 * 1/2 = 1.1; a plain final text has no calls: 1.0
    assert [round(float(s), 6) for s in out.scores] == [1.1, 1.0]
    assert float(plain.scores[0]) == 1.0
    with pytest.raises(UserError, match="bonus"):  # kwargs checked like other builtins
        check_reward_spec("tool_answer", {"bonus": 1}, "reward.functions[0]")


def test_a_trl_function_gets_the_messages_column(tmp_path):
    from danka.rewards.combine import RewardSpec, build_reward_computer
    from danka.types import PromptRow

    (tmp_path / "r.py").write_text(
        "def reward(prompts, completions, messages=None, **kw):\n"
        "    return [float(len(m or [])) for m in messages]\n"
    )
    row = PromptRow(index=0, prompt="q", ground_truth="1")
    with build_reward_computer([RewardSpec("r.py:reward")], base_dir=tmp_path) as rewards:
        out = rewards([row] * 2, ["p"] * 2, ["1", "1"], messages=[msgs(CALL, "1"), None])
    assert out.scores.tolist() == [3.0, 0.0]  # call, tool response, answer; none
