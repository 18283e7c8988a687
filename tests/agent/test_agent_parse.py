from danka.agent.parse import parse_tool_calls, strip_tool_calls


def test_one_good_call_with_text_around():
    text = 'Let me compute.\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "2*3"}}\n</tool_call>'
    [call] = parse_tool_calls(text)
    assert call.ok and call.name == "calculator" and call.arguments == {"expression": "2*3"}
    assert strip_tool_calls(text) == "Let me compute."


def test_several_calls_keep_their_order():
    text = (
        '<tool_call>{"name": "a", "arguments": {}}</tool_call>'
        '<tool_call>{"name": "b", "arguments": {"x": 1}}</tool_call>'
    )
    assert [(c.name, c.arguments) for c in parse_tool_calls(text)] == [("a", {}), ("b", {"x": 1})]


def test_a_list_of_calls_in_one_block_smollm2_style():
    text = '<tool_call>[{"name": "a", "arguments": {"x": 1}}, {"name": "b", "arguments": {}}, 3]'
    a, b, bad = parse_tool_calls(text + "</tool_call>")
    assert (a.name, a.arguments, b.name, b.arguments) == ("a", {"x": 1}, "b", {})
    assert a.ok and b.ok and not bad.ok and "JSON object" in bad.error


def test_arguments_as_json_string_and_parameters_alias():
    a = parse_tool_calls('<tool_call>{"name": "f", "arguments": "{\\"x\\": 2}"}</tool_call>')
    b = parse_tool_calls('<tool_call>{"name": "f", "parameters": {"x": 2}}</tool_call>')
    assert a[0].arguments == b[0].arguments == {"x": 2}


def test_unclosed_tag_is_parsed_to_the_end():
    [call] = parse_tool_calls('<tool_call>{"name": "f", "arguments": {"x": 1}}')
    assert call.ok and call.arguments == {"x": 1}


def test_malformed_calls_carry_an_error():
    cases = {
        "<tool_call>{name: f}</tool_call>": "not valid JSON",
        "<tool_call>[]</tool_call>": "JSON object",
        "<tool_call>7</tool_call>": "JSON object",
        '<tool_call>{"arguments": {}}</tool_call>': '"name"',
        '<tool_call>{"name": "f", "arguments": [1]}</tool_call>': '"arguments" must be',
        '<tool_call>{"name": "f", "arguments": "x=1"}</tool_call>': "not JSON",
        '<tool_call>{"name": "f", "arguments": {}</tool_call>': "not valid JSON",
    }
    for text, reason in cases.items():
        [call] = parse_tool_calls(text)
        assert not call.ok and reason in call.error, (text, call.error)


def test_no_call():
    assert parse_tool_calls("The answer is 6.") == []
