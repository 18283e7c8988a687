from danka.agent.rewards import final_number, tool_answer_reward

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


def test_decoded_text_fallback():
    text = CALL + "\nuser\n<tool_response>\n408\n</tool_response>\nassistant\n408"
    assert tool_answer_reward(None, [text], ["408"], valid_call_bonus=0.2) == [1.2]
    assert final_number("x = 1,234.5") == "1234.5"
