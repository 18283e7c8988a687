import pytest

from danka.agent.tools import load_tool, load_tools
from danka.errors import UserError

TOOL_FILE = '''
def lookup(city: str, days: int = 1) -> str:
    """Weather forecast for a city.

    Args:
        city: name of the city
        days: how many days ahead
    """
    return f"{city}: sunny for {days} days"


def undocumented(x: int) -> int:
    return x
'''


def test_schema_from_signature_and_google_docstring(tmp_path):
    (tmp_path / "t.py").write_text(TOOL_FILE)
    tool = load_tool("t.py:lookup", tmp_path)
    assert tool.name == "lookup" and tool.source == str(tmp_path / "t.py")
    fn = tool.schema["function"]
    assert fn["name"] == "lookup"
    assert fn["description"] == "Weather forecast for a city."
    assert fn["parameters"]["properties"] == {
        "city": {"type": "string", "description": "name of the city"},
        "days": {"type": "integer", "description": "how many days ahead"},
    }
    assert fn["parameters"]["required"] == ["city"]  # days has a default
    assert tool.check_arguments({"city": "Oslo"}) is None
    assert "bad arguments" in tool.check_arguments({"town": "Oslo"})


def test_missing_docstring_is_a_user_error(tmp_path):
    (tmp_path / "t.py").write_text(TOOL_FILE)
    with pytest.raises(UserError, match="Google-style"):
        load_tool("t.py:undocumented", tmp_path)


def test_builtins_and_bad_specs(tmp_path):
    calc = load_tool("calculator")
    assert calc.source == "builtin"
    assert calc.schema["function"]["parameters"]["required"] == ["expression"]
    with pytest.raises(UserError, match="unknown tool"):
        load_tool("calculater")
    with pytest.raises(UserError, match="named 'calculator'"):
        load_tools(["calculator", "calculator"])
