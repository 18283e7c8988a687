import time

import pytest

from danka.agent.parse import ToolCall
from danka.agent.tools import load_tools
from danka.agent.worker import ToolRunner

TOOLS = '''
import time


class Point:
    def __repr__(self):
        return "Point(1, 2)"


def boom(x: int) -> str:
    """Always fails.

    Args:
        x: ignored
    """
    raise RuntimeError(f"boom {x}")


def sleepy(seconds: float) -> str:
    """Sleeps.

    Args:
        seconds: how long
    """
    time.sleep(seconds)
    return "awake"


def data(kind: str) -> dict:
    """Returns non-text values.

    Args:
        kind: dict, object or long
    """
    print("noise on stdout must not break the protocol")
    if kind == "dict":
        return {"a": [1, 2.5], "b": None}
    if kind == "object":
        return Point()
    return "x" * 70
'''


@pytest.fixture
def runner(tmp_path):
    (tmp_path / "t.py").write_text(TOOLS)
    specs = ["calculator", "t.py:boom", "t.py:sleepy", "t.py:data"]
    r = ToolRunner(load_tools(specs, tmp_path), timeout_s=1.0, max_chars=40)
    yield r
    r.close()


def call(name, **arguments):
    return ToolCall(name, arguments)


def test_a_raising_tool_becomes_an_error_message(runner):
    res = runner.run(call("boom", x=3))
    assert not res.ok and res.content == "error: RuntimeError: boom 3"
    assert runner.run(call("calculator", expression="6 * 7")).content == "42"


def test_a_hanging_tool_times_out_and_the_next_call_gets_a_fresh_worker(runner):
    t0 = time.perf_counter()
    res = runner.run(call("sleepy", seconds=30))
    assert not res.ok and "timed out after 1 s" in res.content
    assert time.perf_counter() - t0 < 5
    assert runner.run(call("sleepy", seconds=0)).content == "awake"


def test_non_text_values_are_stringified_and_long_ones_cut(runner):
    assert runner.run(call("data", kind="dict")).content == '{"a": [1, 2.5], "b": null}'
    assert runner.run(call("data", kind="object")).content == "Point(1, 2)"
    long = runner.run(call("data", kind="long")).content
    assert long == "x" * 40 + "... [30 more chars]"


def test_unknown_tool_bad_arguments_and_parse_errors_never_reach_the_worker(runner):
    assert "unknown tool 'nope'" in runner.run(call("nope")).content
    assert "bad arguments" in runner.run(call("calculator", expr="1")).content
    bad = ToolCall(None, raw="{", error="the tool call is not valid JSON")
    assert runner.run(bad).content == "error: the tool call is not valid JSON"
    assert runner._proc is None  # nothing was executed
